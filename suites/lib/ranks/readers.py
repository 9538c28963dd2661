"""Readers of gathered state, run on the ranks (collective: call them on every rank).

The full model state, gradients and optimizer state are read with torch's own APIs
(``get_model_state_dict``, ``summon_full_params``, ``full_tensor``,
``get_optimizer_state_dict``), never with the strategy's save/load, and cloned to CPU so that
they travel back to the controller by pickle and compare there with the single-process
reference (:mod:`suites.lib.controller.oracles`). :func:`local` and :func:`placements` are
the local readers: this rank's own shard of a (DTensor) tensor, and the layout of each
parameter.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from suites.lib.shared.models import clean_name

__all__ = [
    "gathered_grads",
    "gathered_optim_state",
    "gathered_state",
    "local",
    "local_grads",
    "placements",
    "scaling",
]


def gathered_state(model: nn.Module) -> dict[str, Tensor]:
    """The full (unsharded) model state dict, cloned to CPU, keys without wrapper prefixes.

    Read with ``get_model_state_dict(full_state_dict=True)``; never with ``cpu_offload``
    (FSDP1 segfaults on CPU with it: see [Note: cpu_offload only for accelerator shards]
    in ``reference_impl/checkpoint/state.py``).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {clean_name(k): _to_cpu(cast(Tensor, v)) for k, v in state.items()}


def gathered_grads(model: nn.Module) -> dict[str, Tensor | None]:
    """The full gradient of every parameter (None where it has none), by clean name.

    FSDP1: ``FullyShardedDataParallel.summon_full_params(with_grads=True)``; DTensor
    parameters (FSDP2, tensor parallel): ``grad.full_tensor()``.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.tensor import DTensor

    out: dict[str, Tensor | None] = {}
    if any(isinstance(m, FSDP) for m in model.modules()):
        root = next(m for m in model.modules() if isinstance(m, FSDP))
        with FSDP.summon_full_params(root, writeback=False, with_grads=True):
            for name, p in model.named_parameters():
                out[clean_name(name)] = None if p.grad is None else _to_cpu(p.grad)
        return out
    for name, p in model.named_parameters():
        grad = p.grad
        if isinstance(grad, DTensor):
            grad = grad.full_tensor()
        out[clean_name(name)] = None if grad is None else _to_cpu(grad)
    return out


def local_grads(model: nn.Module) -> list[Tensor]:
    """This rank's own part of each gradient, as the strategy holds it (a DTensor's local
    shard; FSDP1's flat or original parameters' gradients): no collective."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return [g.to_local() if isinstance(g, DTensor) else g for g in grads]


def scaling(before: list[Tensor], after: list[Tensor]) -> float | None:
    """The factor that took ``before`` to ``after`` (copies of :func:`local_grads` around a
    clip): the ratio of their norms over all elements, or None where ``before`` is all zero
    or empty (nothing to see on this rank)."""
    if not before:
        return None
    size = float(torch.linalg.vector_norm(torch.stack([b.double().norm() for b in before])))
    if size == 0.0:
        return None
    scaled = float(torch.linalg.vector_norm(torch.stack([a.double().norm() for a in after])))
    return scaled / size


def gathered_optim_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The full optimizer state dict keyed by parameter names (torch's own gather)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    state = get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True)
    )
    return cast(dict, _tree_to_cpu(state))


def local(t: Tensor) -> Tensor:
    """This rank's part of ``t``: a DTensor's local shard, any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _to_cpu(t: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().to("cpu", copy=True)


def _tree_to_cpu(obj: object) -> object:
    if isinstance(obj, Tensor):
        return _to_cpu(obj)
    if isinstance(obj, dict):
        return {k: _tree_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_tree_to_cpu(v) for v in obj)
    return obj


#: a parameter's layout: its placements, the shape of this rank's part and of the whole
Layout = tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]


def placements(model: nn.Module) -> dict[str, Layout]:
    """Each parameter of ``model`` as ``(placements, local shape, global shape)`` by clean
    name: the DTensor's placements as ``repr`` strings (none for a plain tensor) and the
    shape of this rank's part and of the whole. Local: no collective."""
    out = {}
    for name, p in model.named_parameters():
        kinds = tuple(repr(x) for x in getattr(p, "placements", ()))
        mine = p.to_local() if hasattr(p, "to_local") else p
        out[clean_name(name)] = (kinds, tuple(mine.shape), tuple(p.shape))
    return out
