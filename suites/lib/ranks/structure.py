"""Read the structure torch built under a strategy: FSDP units, shards, checkpoint wrappers,
gradient-sync switches. Rank side; reads torch's own objects, never the strategy's.

These look at torch's FSDP1 ``FlatParameter`` bookkeeping (``_numels``,
``_unpadded_unsharded_size``) and FSDP2 parameter groups (``reduce_grads``): the fsdp family
is defined as built on ``FullyShardedDataParallel`` and the model_parallel family on
``fully_shard`` (CONTRACT.md, SHARD-1), so these are the facts the clauses talk about.
:func:`sync_flags_after_a_raise` is the one probe that calls the strategy: it reads the
switches after a body under ``no_backward_sync`` raised (SYNC-1, MP-4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from harness import Strategy, torch_compat
from suites.lib.shared.models import clean_name

__all__ = [
    "UnitShard",
    "checkpoint_wrapped",
    "fsdp1_units",
    "fsdp2_units",
    "nested_checkpoint_wrappers",
    "sync_flags",
    "sync_flags_after_a_raise",
]


@dataclass(frozen=True)
class UnitShard:
    """One FSDP1 unit's flat parameter as seen on one rank.

    Attributes:
        local: numel this rank holds.
        unsharded: numel of the unsharded flat parameter (with alignment padding).
        params: numel of the original parameters it holds (no padding).
        count: number of original parameters.
    """

    local: int
    unsharded: int
    params: int
    count: int


def _fsdp1() -> Any:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel


def fsdp1_units(model: nn.Module) -> dict[str, UnitShard | None]:
    """Every FSDP1 unit by clean name (root: ``""``), with its flat parameter's shard
    (None for a unit that manages no parameters)."""
    units: dict[str, UnitShard | None] = {}
    for name, module in model.named_modules():
        if not isinstance(module, _fsdp1()):
            continue
        sizes = torch_compat.fsdp1_flat_param_sizes(module)
        units[clean_name(name)] = None if sizes is None else UnitShard(*sizes)
    return units


def fsdp2_units(model: nn.Module) -> list[str]:
    """Clean names of the modules ``fully_shard`` was applied to (root: ``""``)."""
    from torch.distributed.fsdp import FSDPModule

    return [clean_name(n) for n, m in model.named_modules() if isinstance(m, FSDPModule)]


def checkpoint_wrapped(model: nn.Module) -> list[str]:
    """Clean names of the modules inside a ``CheckpointWrapper`` (the wrapped module's name)."""
    cls = torch_compat.CheckpointWrapper
    return sorted(clean_name(n) for n, m in model.named_modules() if isinstance(m, cls))


def nested_checkpoint_wrappers(model: nn.Module) -> list[str]:
    """Names of checkpoint wrappers that sit inside another checkpoint wrapper."""
    cls = torch_compat.CheckpointWrapper
    nested = []
    for name, module in model.named_modules():
        if isinstance(module, cls):
            inner = [n for n, m in module.named_modules() if n and isinstance(m, cls)]
            nested += [f"{clean_name(name)!r} holds another wrapper at {n!r}" for n in inner]
    return nested


def sync_flags(model: nn.Module) -> dict[str, Any]:
    """Gradient-sync switch of every FSDP unit: FSDP1 ``_sync_gradients``, FSDP2 each param
    group's ``(reduce_grads, all_reduce_grads)``."""
    from torch.distributed.fsdp import FSDPModule

    flags: dict[str, Any] = {}
    for name, module in model.named_modules():
        if isinstance(module, _fsdp1()):
            flags[clean_name(name)] = torch_compat.fsdp1_sync_gradients(module)
        elif isinstance(module, FSDPModule):
            flags[clean_name(name)] = tuple(
                (g.reduce_grads, g.all_reduce_grads)
                for g in torch_compat.fsdp2_param_groups(module)
            )
    return flags


def sync_flags_after_a_raise(strategy: Strategy, model: nn.Module) -> dict[str, Any]:
    """:func:`sync_flags` after a body under ``no_backward_sync(model, enabled=True)`` raised
    (the context manager must restore the switches on the way out)."""
    try:
        with strategy.no_backward_sync(model, enabled=True):
            raise KeyError("the body raised")
    except KeyError:
        pass
    return sync_flags(model)
