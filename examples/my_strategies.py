"""A third-party strategy and the factory that plugs it into shardcheck."""

from __future__ import annotations

import dataclasses

from harness import StrategySpec, Unsupported
from reference_impl import FSDPStrategy  # stands in for your own strategy class

#: The sharding strategies this strategy does not implement (exact names: an invalid name
#: such as "HYBRID_SHARD_ZERO2" must reach the constructor, which refuses it with ValueError).
NOT_IMPLEMENTED = {"HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"}
#: StrategySpec fields of the other family: an FSDP-only strategy has no use for them, so a
#: value other than the default is refused, never ignored.
MODEL_PARALLEL_FIELDS = (
    "parallelize_fn",
    "data_parallel_size",
    "tensor_parallel_size",
    "save_distributed_checkpoint",
)


class MyFSDPStrategy(FSDPStrategy):
    """Your strategy (here: the reference FSDP strategy under another name)."""


def make_strategy(spec: StrategySpec) -> MyFSDPStrategy:
    """Build this rank's strategy from the harness's spec, or say what is not supported."""
    if spec.family != "fsdp":
        raise Unsupported("MyFSDPStrategy has no tensor parallelism", "family", spec.family)
    defaults = {f.name: f.default for f in dataclasses.fields(StrategySpec)}
    for name in MODEL_PARALLEL_FIELDS:
        if getattr(spec, name) != defaults[name]:
            raise ValueError(
                f"{name}={getattr(spec, name)!r} is not an option of MyFSDPStrategy "
                f"(an fsdp strategy); leave it at its default ({defaults[name]!r})."
            )
    sharding = getattr(spec.sharding_strategy, "name", spec.sharding_strategy)  # enum or str
    if str(sharding).upper() in NOT_IMPLEMENTED:
        raise Unsupported(
            "hybrid sharding is not implemented", "sharding_strategy", spec.sharding_strategy
        )
    return MyFSDPStrategy(
        precision=spec.precision,
        sharding_strategy=spec.sharding_strategy,
        auto_wrap_policy=spec.auto_wrap_policy,
        activation_checkpointing_policy=spec.activation_checkpointing_policy,
        state_dict_type=spec.state_dict_type,
        cpu_offload=spec.cpu_offload,
        device_mesh=spec.device_mesh,
        root_device=spec.device,  # the rank's device: cpu with gloo, cuda:<rank> with NCCL
        **spec.extra,  # --strategy-option KEY=VALUE lands here
    )
