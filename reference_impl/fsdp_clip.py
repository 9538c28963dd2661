"""The global gradient norm of an FSDP1 model (CONTRACT.md CLIP-1).

[Note: clipping] FSDP1's ``clip_grad_norm_`` has no non-finite check and scales as soon as
it has the norm. :func:`fsdp_grad_norm` only computes the norm, as if the model were not
sharded: sharded gradients are summed over their unit's shard group (for hybrid sharding the
group inside a replica), replicated ones (``NO_SHARD``) are counted once. The strategy checks
the result before it scales anything.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy

__all__ = ["fsdp_grad_norm"]


def fsdp_grad_norm(
    root: FSDP, norm_type: float, device: torch.device
) -> tuple[list[Tensor], Tensor]:
    """This rank's gradients and the global ``norm_type``-norm of all gradients.

    Collective: every rank of the model's process groups must call it.

    Args:
        root: the sharded root module.
        norm_type: the order of the norm (``math.inf`` for the max norm).
        device: where to compute (the rank's device).

    Returns:
        ``(local_gradients, total_norm)``; the norm is a float32 scalar, equal on every rank.
    """
    groups, replicated = _local_gradients(root)
    total = _reduce_norms(replicated, norm_type, device)
    for group, grads in groups:
        part = _reduce_norms(grads, norm_type, device)
        if math.isinf(norm_type):
            part = _largest_over(part, group)
        else:
            dist.all_reduce(part, op=dist.ReduceOp.SUM, group=group)
        total = torch.maximum(total, part) if math.isinf(norm_type) else total + part
    if not math.isinf(norm_type):
        total = total ** (1.0 / norm_type)
    local = [g for _, grads in groups for g in grads] + replicated
    return local, total


def _largest_over(part: Tensor, group: Any) -> Tensor:
    """The largest of the ranks' ``part`` over ``group``, nan if any rank's is nan.

    [Note: a nan through MAX] gloo's MAX all-reduce compares, and ``max(x, nan)`` keeps
    ``x``: a nan on any rank but the group's first was dropped, so with ``norm_type=inf``
    the other ranks returned a finite norm, ``error_if_nonfinite=True`` raised on one rank
    only and the others went on (CLIP-1). The nan travels as a flag of its own instead, in
    the same reduction.
    """
    is_nan = torch.isnan(part)
    stats = torch.stack([torch.where(is_nan, torch.zeros_like(part), part), is_nan.to(part.dtype)])
    dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
    return torch.where(stats[1] > 0, torch.full_like(part, float("nan")), stats[0])


def _local_gradients(root: FSDP) -> tuple[list[tuple[Any, list[Tensor]]], list[Tensor]]:
    """This rank's gradients: sharded ones by process group, and the replicated ones."""
    by_group: dict[int, tuple[Any, list[Tensor]]] = {}
    replicated: list[Tensor] = []
    seen: set[int] = set()
    units = FSDP.fsdp_modules(root)
    for unit in units:  # every unit contributes a (possibly empty) group, in the same order
        if unit.sharding_strategy != ShardingStrategy.NO_SHARD:
            by_group.setdefault(id(unit.process_group), (unit.process_group, []))
    for unit in reversed(units):  # innermost first: a parameter belongs to its closest unit
        for param in unit.parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            if param.grad is None or param.grad.numel() == 0:
                continue
            if unit.sharding_strategy == ShardingStrategy.NO_SHARD:
                replicated.append(param.grad)
            else:
                by_group[id(unit.process_group)][1].append(param.grad)
    return list(by_group.values()), replicated


def _reduce_norms(grads: list[Tensor], p: float, device: torch.device) -> Tensor:
    """Sum of ``|g|_p ** p`` (or the max for ``p = inf``) over ``grads``, as float32."""
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=device)
    norms = torch.stack(
        [torch.linalg.vector_norm(g, p, dtype=torch.float32).to(device) for g in grads]
    )
    return norms.max() if math.isinf(p) else (norms**p).sum()
