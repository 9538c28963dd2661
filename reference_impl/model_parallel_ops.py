"""FSDP2 and DTensor mechanics behind :class:`~reference_impl.model_parallel.ModelParallelStrategy`.

- :func:`gradient_sync_disabled`: FSDP2's gradient-sync switch, restored exactly (MP-4, SYNC-1).
- :func:`grad_norm` / :func:`scale_grads_`: the global norm of DTensor gradients on any mix of
  meshes and placements, equal on every rank, and in-place scaling (CLIP-1).
- :func:`materialize`: a parallelized meta-device module allocated and re-initialized
  (API-3, INIT-1).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Generator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from harness import torch_compat
from reference_impl import meta_init

__all__ = [
    "describe_names",
    "fsdp_modules",
    "grad_norm",
    "gradient_sync_disabled",
    "materialize",
    "scale_grads_",
]


def fsdp_modules(module: nn.Module) -> list[tuple[str, FSDPModule]]:
    """``(qualified name, module)`` of every FSDP2 (``fully_shard``) module in ``module``."""
    return [(name, mod) for name, mod in module.named_modules() if isinstance(mod, FSDPModule)]


def describe_names(names: list[str]) -> str:
    """Up to three module names for an error message (``'<root>'`` for the root)."""
    shown = ", ".join(repr(n or "<root>") for n in names[:3])
    return shown + (f" (and {len(names) - 3} more)" if len(names) > 3 else "")


@contextlib.contextmanager
def gradient_sync_disabled(modules: list[FSDPModule]) -> Generator[None, None, None]:
    """Turn gradient reduction off on ``modules`` inside the block; restore it exactly.

    Args:
        modules: the FSDP2 modules whose sync to suspend (each one only, not recursively).
    """
    # [Note: exact restore] FSDP2 keeps the switch per parameter group as two flags
    # (reduce_grads, all_reduce_grads); a user may have set them differently per module
    # (set_requires_all_reduce for HSDP), so the exact previous values are saved and put back.
    groups = [g for mod in modules for g in torch_compat.fsdp2_param_groups(mod)]
    saved = [(g.reduce_grads, g.all_reduce_grads) for g in groups]
    try:
        for mod in modules:
            mod.set_requires_gradient_sync(False, recurse=False)
        yield
    finally:
        for group, (reduce_grads, all_reduce_grads) in zip(groups, saved, strict=True):
            group.reduce_grads = reduce_grads
            group.all_reduce_grads = all_reduce_grads


def grad_norm(grads: list[Tensor], norm_type: float, device: torch.device) -> Tensor:
    """The norm of all ``grads`` as one unsharded vector, identical on every rank.

    DTensor gradients live on different meshes and placements (FSDP2 shards on the
    data-parallel dim, tensor-parallel placements on the 2-D mesh), so they are normed per
    (mesh, placements) group; ``full_tensor()`` reduces each group's partial norm over its
    mesh and counts replicated dims once. Plain tensors are local (counted as they are).
    Collective: every rank must call it with gradients of the same structure.

    Args:
        grads: this rank's gradients (DTensors and/or plain tensors).
        norm_type: the p of the p-norm (``math.inf`` for the max norm).
        device: the rank's device, where the float32 result lives.
    """
    if math.isinf(norm_type):
        return _agree(_local_largest(grads, device))
    groups: dict[Any, list[Tensor]] = {}
    for grad in grads:
        key = (grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None
        groups.setdefault(key, []).append(grad)
    norms = []
    for members in groups.values():
        norm = torch.nn.utils.get_total_norm(members, norm_type, foreach=False)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        norms.append(norm.to(device=device, dtype=torch.float32))
    if not norms:
        return torch.zeros((), device=device)
    return _agree(torch.linalg.vector_norm(torch.stack(norms), norm_type))


def _local_largest(grads: list[Tensor], device: torch.device) -> Tensor:
    """The largest absolute value of this rank's parts of ``grads`` (0 when it holds none),
    as float32 on ``device``; nan if a part holds nan.

    [Note: inf norm of empty shards] The max norm of the whole gradient is the largest of
    every rank's local largest values, whatever the placements: a replicated part counted
    twice changes no maximum. torch's ``get_total_norm`` on DTensors raised instead on a rank
    whose local shard is empty (``linalg.vector_norm cannot compute the inf norm on an empty
    tensor``: a one-element parameter over two data-parallel ranks), and the other ranks
    then waited in the reduction (CLIP-1 with ``norm_type=inf``). The local largest values
    are reduced by :func:`_agree`, which also carries a nan through.
    """
    largest = [
        (g.to_local() if isinstance(g, DTensor) else g).detach().abs().max().float().to(device)
        for g in grads
        if (g.to_local() if isinstance(g, DTensor) else g).numel() > 0
    ]
    if not largest:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.stack(largest).max()


def _agree(total: Tensor) -> Tensor:
    """Make every rank return the same norm, the largest of the ranks' ``total`` and
    non-finite if any rank's is (one all-reduce).

    [Note: one verdict] A 1-D DTensor on the data-parallel submesh is reduced within its
    submesh only; if one replica's gradient went non-finite, ranks of other submeshes would
    not see it and would go on while it raises. The MAX over the world of
    ``(finite norm or 0, inf flag, nan flag)`` gives one value and one verdict everywhere:
    nan if any rank's norm is nan, else inf if any is inf, as torch's norm of the whole
    gradient is. It used to return a rank's own non-finite total where it had one and nan
    on the others: with ``error_if_nonfinite=False`` a poisoned rank returned inf and the
    rest nan, and they scaled their gradients by 0 and by nan (CLIP-1 wants one value, and
    torch's scaling, everywhere; the max norm's local values of :func:`_local_largest` met it
    on every mesh, the submesh reductions above on a 2-D mesh). A MAX reduction of a nan
    itself may drop it (a backend's ``max`` compares), so nan travels as a flag.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return total
    is_nan, is_inf = bool(torch.isnan(total)), bool(torch.isinf(total))
    stats = torch.stack(
        [
            torch.zeros_like(total) if is_nan or is_inf else total,
            total.new_tensor(float(is_inf)),
            total.new_tensor(float(is_nan)),
        ]
    )
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if stats[2] > 0:
        return torch.full_like(total, float("nan"))
    if stats[1] > 0:
        return torch.full_like(total, float("inf"))
    return stats[0]


def materialize(module: nn.Module, device: torch.device) -> None:
    """Allocate a meta-device module on ``device`` and re-initialize it (API-3, INIT-1).

    ``to_empty`` runs on the root (FSDP2 re-registers its sharded parameters there), then
    every module that owns state gets one ``reset_parameters()`` call, and tied parameters
    are tied again (recorded after ``parallelize_fn``, which may replace parameters).

    Raises:
        TypeError: a module that owns state defines no ``reset_parameters`` (checked before
            anything is allocated).
    """
    names = {id(mod): name for name, mod in module.named_modules()}
    owners = [mod for mod in module.modules() if meta_init.owns_state(mod)]
    missing = [
        names[id(mod)] for mod in owners if not callable(getattr(mod, "reset_parameters", None))
    ]
    if missing:
        raise TypeError(
            f"Modules created with empty_init=True own parameters or buffers but define no "
            f"reset_parameters(): {describe_names(missing)}. Add a reset_parameters() method that "
            "initializes the module's own state, or use empty_init=False."
        )
    ties = meta_init.tied_parameter_groups(module)
    module.to_empty(device=device)
    with torch.no_grad():
        for mod in owners:
            mod.reset_parameters()  # type: ignore[operator]
    meta_init.retie_parameters(ties)


def scale_grads_(grads: list[Tensor], max_norm: float, total: Tensor) -> None:
    """Scale ``grads`` in place so that a global norm ``total`` becomes at most ``max_norm``.

    Each rank scales its own shards (the local tensors of DTensors) by the same factor.
    """
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for grad in grads:
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            local.mul_(coef.to(device=local.device, dtype=local.dtype))
