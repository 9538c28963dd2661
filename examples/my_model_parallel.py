"""A model_parallel (FSDP2 + tensor parallel) strategy's factory for shardcheck."""

from __future__ import annotations

import dataclasses

from harness import StrategySpec, Unsupported
from reference_impl import ModelParallelStrategy  # stands in for your own strategy class

#: StrategySpec fields of the fsdp family: refused unless left at their defaults.
FSDP_FIELDS = (
    "sharding_strategy",
    "auto_wrap_policy",
    "activation_checkpointing_policy",
    "state_dict_type",
    "cpu_offload",
    "device_mesh",
)


def make_strategy(spec: StrategySpec) -> ModelParallelStrategy:
    """Build this rank's strategy from the harness's spec, or say what is not supported."""
    if spec.family != "model_parallel":
        raise Unsupported("this strategy is FSDP2 + tensor parallel only", "family", spec.family)
    defaults = {f.name: f.default for f in dataclasses.fields(StrategySpec)}
    for name in FSDP_FIELDS:
        if getattr(spec, name) != defaults[name]:
            raise ValueError(
                f"{name}={getattr(spec, name)!r} is not an option of a model_parallel "
                f"strategy; leave it at its default ({defaults[name]!r})."
            )
    if spec.parallelize_fn is None:
        raise ValueError("parallelize_fn=None: pass the suite's (spec.parallelize_fn) through")
    return ModelParallelStrategy(
        spec.parallelize_fn,  # the suite's: it shards the suite's own models on your mesh
        data_parallel_size=spec.data_parallel_size,
        tensor_parallel_size=spec.tensor_parallel_size,
        save_distributed_checkpoint=spec.save_distributed_checkpoint,
        precision=spec.precision,
        root_device=spec.device,
        **spec.extra,  # --strategy-option KEY=VALUE lands here
    )
