"""An fsdp2 strategy's factory for shardcheck: a strategy that calls fully_shard itself."""

from __future__ import annotations

import dataclasses

from torch.distributed.fsdp import CPUOffloadPolicy

from harness import StrategySpec, Unsupported
from reference_impl import FSDP2Strategy  # stands in for your own strategy class

#: StrategySpec fields the fsdp2 family does not read: refused unless left at their defaults.
OTHER_FIELDS = (
    "sharding_strategy",
    "parallelize_fn",
    "data_parallel_size",
    "tensor_parallel_size",
    "save_distributed_checkpoint",
)


def make_strategy(spec: StrategySpec) -> FSDP2Strategy:
    """Build this rank's strategy from the harness's spec, or say what is not supported."""
    if spec.family != "fsdp2":
        raise Unsupported("this strategy shards with fully_shard only", "family", spec.family)
    defaults = {f.name: f.default for f in dataclasses.fields(StrategySpec)}
    for name in OTHER_FIELDS:
        if getattr(spec, name) != defaults[name]:
            raise ValueError(
                f"{name}={getattr(spec, name)!r} is not an option of an fsdp2 strategy; "
                f"leave it at its default ({defaults[name]!r})."
            )
    # only True and a CPUOffloadPolicy offload: OffloadPolicy() (no offload) is not refused
    offloads = spec.cpu_offload is True or isinstance(spec.cpu_offload, CPUOffloadPolicy)
    if offloads and spec.device.type == "cpu":
        raise Unsupported("offload needs an accelerator", "cpu_offload", spec.cpu_offload)
    return FSDP2Strategy(
        precision=spec.precision,  # becomes the units' MixedPrecisionPolicy
        auto_wrap_policy=spec.auto_wrap_policy,  # set of classes or fn(module) -> bool
        reshard_after_forward=spec.reshard_after_forward,  # bool or int
        activation_checkpointing_policy=spec.activation_checkpointing_policy,
        state_dict_type=spec.state_dict_type,
        cpu_offload=spec.cpu_offload,  # bool or an FSDP2 OffloadPolicy
        device_mesh=spec.device_mesh,  # None: 1-D; (replicate, shard): HSDP
        root_device=spec.device,
        **spec.extra,  # --strategy-option KEY=VALUE lands here
    )
