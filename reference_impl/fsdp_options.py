"""Validation of :class:`~reference_impl.fsdp.FSDPStrategy` constructor options (CONTRACT.md
CFG-1..CFG-6, CFG-10).

Each function checks one option eagerly and returns it in the form the strategy uses, or
raises an error that names the option, its value, the constraint and the fix.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffload, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from reference_impl.policies import Policy, normalize_policy

__all__ = [
    "HYBRID_STRATEGIES",
    "has_accelerator",
    "resolve_activation_checkpointing",
    "resolve_cpu_offload",
    "resolve_device_mesh",
    "resolve_fsdp_kwargs",
    "resolve_sharding_strategy",
    "resolve_state_dict_type",
]

HYBRID_STRATEGIES = (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
# Arguments of FSDP the strategy sets itself from its own named options.
_MANAGED = {"module", "sharding_strategy", "cpu_offload", "auto_wrap_policy", "mixed_precision"}
_MANAGED |= {"device_mesh", "self"}


def has_accelerator() -> bool:
    """Whether this machine has an accelerator FSDP can offload from (CUDA or other)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


def resolve_sharding_strategy(value: str | ShardingStrategy) -> ShardingStrategy:
    """Accept the five names in any case, or the enum (CFG-1)."""
    if isinstance(value, ShardingStrategy):
        return value
    names = [s.name for s in ShardingStrategy]
    if isinstance(value, str) and value.upper() in names:
        return ShardingStrategy[value.upper()]
    raise ValueError(
        f"sharding_strategy={value!r} is not a sharding strategy; use one of "
        f"{', '.join(names)} (any case) or a torch.distributed.fsdp.ShardingStrategy."
    )


def resolve_cpu_offload(value: bool | CPUOffload | None) -> CPUOffload:
    """Accept a bool or ``CPUOffload``; refuse parameter offload without an accelerator (CFG-6)."""
    if value is None or isinstance(value, bool):
        offload = CPUOffload(offload_params=bool(value))
    elif isinstance(value, CPUOffload):
        offload = value
    else:
        raise TypeError(
            f"cpu_offload={value!r} must be a bool or a torch.distributed.fsdp.CPUOffload."
        )
    if offload.offload_params and not has_accelerator():
        raise ValueError(
            f"cpu_offload={value!r} asks FSDP to offload parameters to CPU, but this machine "
            "has no accelerator: the parameters already live on the CPU and FSDP's offload "
            "path needs pinned accelerator memory. Use cpu_offload=False here."
        )
    return offload


def resolve_state_dict_type(value: str) -> str:
    """The checkpoint format ``save_checkpoint`` writes: ``"full"`` or ``"sharded"`` (shared
    with :class:`~reference_impl.fsdp2.FSDP2Strategy`).

    Raises:
        ValueError: any other value; the message names it and the two formats.
    """
    if value not in ("full", "sharded"):
        raise ValueError(
            f"state_dict_type={value!r} is not supported; use 'full' (one file "
            "written by rank 0) or 'sharded' (a torch.distributed.checkpoint directory)."
        )
    return value


def resolve_activation_checkpointing(legacy: Any, policy: Any) -> Policy | None:
    """Merge the deprecated ``activation_checkpointing`` with ``activation_checkpointing_policy``.

    The deprecated form (a class or a list of classes) warns with ``DeprecationWarning``;
    giving both raises ``ValueError`` (CFG-4).
    """
    if legacy is not None and policy is not None:
        raise ValueError(
            f"activation_checkpointing={legacy!r} and activation_checkpointing_policy="
            f"{policy!r} were both given; pass only activation_checkpointing_policy "
            "(activation_checkpointing is deprecated)."
        )
    if legacy is None:
        return normalize_policy("activation_checkpointing_policy", policy)
    warnings.warn(
        "activation_checkpointing is deprecated; pass activation_checkpointing_policy="
        "{LayerClass, ...} instead.",
        DeprecationWarning,
        stacklevel=3,
    )
    classes = legacy if isinstance(legacy, (list, tuple, set, frozenset)) else [legacy]
    return normalize_policy("activation_checkpointing", set(classes))


def resolve_device_mesh(
    value: tuple[int, int] | DeviceMesh | None,
    strategy: ShardingStrategy,
    world_size: int | None,
) -> tuple[int, int] | DeviceMesh | None:
    """Check a ``(replicate, shard)`` tuple or a ``DeviceMesh`` (CFG-3).

    Args:
        value: the option.
        strategy: the sharding strategy (hybrid strategies take a 2-D mesh, others a 1-D one).
        world_size: the world size when known (the default process group exists), else None.
    """
    if value is None:
        return None
    hybrid = strategy in HYBRID_STRATEGIES
    if isinstance(value, DeviceMesh):
        if value.ndim != (2 if hybrid else 1):
            raise ValueError(
                f"device_mesh has {value.ndim} dimension(s), but sharding_strategy="
                f"{strategy.name} needs a {'2-D (replicate, shard)' if hybrid else '1-D'} mesh."
            )
        return value
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise TypeError(
            f"device_mesh={value!r} must be a tuple (replicate, shard) of two positive ints "
            "or a torch DeviceMesh."
        )
    if not hybrid:
        raise ValueError(
            f"device_mesh={value!r} (replicate, shard) only applies to hybrid sharding, but "
            f"sharding_strategy={strategy.name}; use HYBRID_SHARD or drop device_mesh."
        )
    check_mesh_size(value, world_size)
    return value


def check_mesh_size(shape: tuple[int, int], world_size: int | None) -> None:
    """Raise ``ValueError`` when the mesh shape does not cover the world exactly."""
    if world_size is not None and shape[0] * shape[1] != world_size:
        raise ValueError(
            f"device_mesh={shape!r} has {shape[0]} x {shape[1]} = {shape[0] * shape[1]} ranks, "
            f"but the world size is {world_size}; pick a (replicate, shard) whose product is "
            f"{world_size}."
        )


def resolve_fsdp_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Check extra keyword arguments against FSDP's signature; default ``use_orig_params=True``."""
    accepted = set(inspect.signature(FSDP.__init__).parameters) - _MANAGED
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise TypeError(
            f"FSDPStrategy got unexpected keyword argument(s) {', '.join(unknown)}; extra "
            f"keyword arguments go to FullyShardedDataParallel, which accepts "
            f"{', '.join(sorted(accepted))}."
        )
    return {"use_orig_params": True, **kwargs}
