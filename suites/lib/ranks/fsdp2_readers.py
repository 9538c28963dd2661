"""What FSDP2 (``fully_shard``) units hold, read on a rank from torch's own per-parameter
state: the units of a model, the dtypes each parameter is gathered and reduced in, and the
layout of a unit's registered parameters after a forward (the fsdp2 family's clauses, and
PREC-2's reduce dtype of the families that shard with FSDP2)."""

from __future__ import annotations

from typing import Any

from torch import nn

from harness import torch_compat

__all__ = ["fsdp2_units", "param_layouts", "reduce_dtypes", "unit_dtypes"]


def fsdp2_units(model: nn.Module) -> list[str]:
    """Qualified names (checkpoint-wrapper segments removed) of the ``FSDPModule`` s of
    ``model``, ``""`` for the root, sorted."""
    from torch.distributed.fsdp import FSDPModule

    return sorted(
        name.replace("._checkpoint_wrapped_module", "").replace("_checkpoint_wrapped_module", "")
        for name, module in model.named_modules()
        if isinstance(module, FSDPModule)
    )


def _fsdp_params(model: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [
        fsdp_param
        for module in model.modules()
        if isinstance(module, FSDPModule)
        for group in torch_compat.fsdp2_param_groups(module)
        for fsdp_param in group.fsdp_params
    ]


def reduce_dtypes(model: nn.Module, *, trainable_only: bool = True) -> list[str]:
    """The dtypes FSDP2 reduces gradients in, over the (trainable) parameters of every unit
    of ``model``: a parameter's ``reduce_dtype``, else the dtype it is gathered in for
    forward, else its stored dtype (torch leaves the first two unset when they equal the next).
    Read after the first forward (FSDP2 sets them at its lazy init)."""
    found = set()
    for fsdp_param in _fsdp_params(model):
        if trainable_only and not fsdp_param.sharded_param.requires_grad:
            continue
        dtype = fsdp_param.reduce_dtype or fsdp_param.param_dtype or fsdp_param.orig_dtype
        found.add(str(dtype))
    return sorted(found)


def unit_dtypes(model: nn.Module, unit: str) -> list[tuple[str, str]]:
    """``(reduce dtype, cast-back dtype)`` of each FSDP2 parameter group of the unit named
    ``unit`` (a clean module name), as the group resolved them: what its gradients reduce
    in and the dtype they are cast to for the sharded parameters (``None`` when unresolved:
    FSDP2 then casts nothing). Read after a forward."""
    from torch.distributed.fsdp import FSDPModule

    found = []
    for name, module in model.named_modules():
        clean = name.replace("._checkpoint_wrapped_module", "").replace(
            "_checkpoint_wrapped_module", ""
        )
        if clean != unit or not isinstance(module, FSDPModule):
            continue
        for group in torch_compat.fsdp2_param_groups(module):
            orig = getattr(group, "_orig_dtype", None)
            # unset when it equals the dtype the gradients are computed in (torch then
            # reduces in that one): a parameter's gathered dtype, else its stored one
            reduce = getattr(group, "_reduce_dtype", None) or next(
                (p.param_dtype or p.orig_dtype for p in group.fsdp_params), None
            )
            found.append((str(reduce), str(orig)))
    return found


def param_layouts(model: nn.Module) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every parameter of ``model`` as registered now: ``("dtensor", local shape)`` for a
    DTensor (sharded, or resharded to a smaller group), ``("tensor", shape)`` for a plain
    tensor (unsharded), by its clean name."""
    from torch.distributed.tensor import DTensor

    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, param in model.named_parameters():
        clean = name.replace("_checkpoint_wrapped_module.", "")
        if isinstance(param, DTensor):
            out[clean] = ("dtensor", tuple(param.to_local().shape))
        else:
            out[clean] = ("tensor", tuple(param.shape))
    return out
