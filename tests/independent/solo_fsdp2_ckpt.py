"""Checkpoints of :mod:`independent.solo_fsdp2`, from torch's public API only.

The model's state is ``module.state_dict()`` (FSDP2 gives sharded DTensors and plain
buffers); the optimizers' state is read straight from ``optimizer.state`` and written back
there, each tensor cut to its parameter's placement with ``distribute_tensor``. Full files
gather one tensor at a time (``full_tensor``) and keep it on rank 0 only; sharded
checkpoints are ``torch.distributed.checkpoint`` directories plus ``meta.pt``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from independent import plumbing

__all__ = ["PLANTED", "groups_keyed", "ordered_params", "param_names", "save_full", "save_sharded"]

#: the planted bugs are on unless SOLO_FSDP2_CLEAN=1 (to check the strategy without them)
PLANTED = os.environ.get("SOLO_FSDP2_CLEAN") != "1"

Filters = dict[str, Callable[[str, Any], bool]]


def param_names(module: nn.Module) -> dict[int, str]:
    """Parameter id -> its first name (a tied parameter has one)."""
    return {id(p): n for n, p in module.named_parameters()}


def ordered_params(optimizer: Optimizer) -> list[Any]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def groups_keyed(optimizer: Optimizer, keys: list[Any]) -> list[dict[str, Any]]:
    """The optimizer's groups with ``params`` replaced by ``keys`` (in order)."""
    out, start = [], 0
    for group in optimizer.param_groups:
        count = len(group["params"])
        out.append({**{k: v for k, v in group.items() if k != "params"},
                    "params": keys[start : start + count]})  # fmt: skip
        start += count
    return out


# --- full ------------------------------------------------------------------------------


def _gathered(value: Any, keep: bool) -> Any:
    """``value`` whole (an all-gather for a DTensor), on the CPU where ``keep``, else None."""
    if isinstance(value, DTensor):
        value = value.full_tensor()
    if not keep:
        return None
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _keeps_full_state() -> bool:
    """Whether this rank keeps what a full save gathers (rank 0 writes the file)."""
    if PLANTED:  # PLANTED (MEM-3): every rank keeps the gathered state until the save ends
        return True
    return dist.get_rank() == 0


def full_model_state(module: nn.Module) -> dict[str, Any]:
    """The gathered model state dict on rank 0 (``{}`` elsewhere); a tied tensor is
    gathered once and stored under each of its names."""
    keep = _keeps_full_state()
    first: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        first.setdefault(id(param), name)
    alias = {n: first[id(p)] for n, p in module.named_parameters(remove_duplicate=False)}
    out: dict[str, Any] = {}
    for name, tensor in module.state_dict().items():
        if alias.get(name, name) != name:
            if keep:
                out[name] = out[alias[name]]
            continue
        value = _gathered(tensor, keep)
        if keep:
            out[name] = value
    return out


def full_optimizer_state(module: nn.Module, optimizer: Optimizer, by_index: bool) -> Any:
    """One optimizer's gathered state on rank 0: keyed by parameter name, or by integer id
    in ``param_groups`` order (torch's standard form) with ``by_index``."""
    names, keep = param_names(module), _keeps_full_state()
    params = ordered_params(optimizer)
    unknown = [i for i, p in enumerate(params) if id(p) not in names]
    if unknown:
        raise ValueError(
            f"the optimizer holds parameters {unknown} (in param_groups order) that are not "
            "the set-up module's; create it from the module setup_module returned."
        )
    keys: list[Any] = list(range(len(params))) if by_index else [names[id(p)] for p in params]
    state: dict[Any, Any] = {}
    for key, param in zip(keys, params, strict=True):
        entry = {k: _gathered(v, keep) for k, v in optimizer.state.get(param, {}).items()}
        if entry and keep:
            state[key] = entry
    return {"state": state, "param_groups": groups_keyed(optimizer, keys)}


def save_full(
    path: str,
    key: str,
    module: nn.Module,
    optimizers: dict[str, Any],
    rest: dict[str, Any],
    filters: Filters,
) -> None:
    """Gather everything to rank 0, which writes one file atomically."""
    if os.path.isdir(path) and not plumbing.is_sharded_checkpoint(path):
        raise IsADirectoryError(f"{path!r} is a directory that is not a checkpoint; not replaced.")
    content: dict[str, Any] = {key: full_model_state(module)}
    for name, value in optimizers.items():
        if isinstance(value, Optimizer):
            content[name] = full_optimizer_state(module, value, by_index=False)
        else:  # a list is the trainer layout: torch's integer-keyed form
            content[name] = [full_optimizer_state(module, o, by_index=True) for o in value]
    content.update(plumbing.plain_metadata(rest))
    scratch = plumbing.scratch_path(path)
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            for name, chosen in filters.items():
                content[name] = {k: v for k, v in content[name].items() if chosen(k, v)}
            torch.save(content, scratch)
            plumbing.place_atomically(scratch, path)
        except BaseException as exc:
            plumbing.remove(scratch)
            error = exc
    plumbing.agree(error, f"saving {path!r}")


# --- sharded ---------------------------------------------------------------------------


def sharded_optimizer_state(module: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """One optimizer's state as this rank holds it (DTensors), keyed by parameter name."""
    names = param_names(module)
    params = ordered_params(optimizer)
    keys = [names.get(id(p), f"<foreign {i}>") for i, p in enumerate(params)]
    state = {k: dict(optimizer.state[p]) for k, p in zip(keys, params, strict=True)
             if optimizer.state.get(p)}  # fmt: skip
    return {"state": state, "param_groups": groups_keyed(optimizer, keys)}


def save_sharded(
    path: str, key: str, module: nn.Module, optimizers: dict[str, Any], rest: dict[str, Any]
) -> None:
    """Every rank writes its shards into a DCP directory, moved into place once complete."""
    model = module.state_dict()
    if PLANTED:  # PLANTED (CKPT-BUF-1): keeps the parameters only, leaves the buffers out
        params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
        model = {n: t for n, t in model.items() if n in params}
    content: dict[str, Any] = {key: model}
    for name, value in optimizers.items():
        if isinstance(value, Optimizer):
            content[name] = sharded_optimizer_state(module, value)
        else:
            content[name] = [sharded_optimizer_state(module, o) for o in value]
    scratch = plumbing.scratch_path(path)
    error: BaseException | None = None
    try:
        dcp.save(content, checkpoint_id=scratch)
        if dist.get_rank() == 0:
            torch.save(plumbing.plain_metadata(rest), os.path.join(scratch, "meta.pt"))
    except BaseException as exc:
        error = exc
    try:
        plumbing.agree(error, f"saving {path!r}")
        error = None
        if dist.get_rank() == 0:
            try:
                plumbing.place_atomically(scratch, path)
            except BaseException as exc:
                error = exc
        plumbing.agree(error, f"saving {path!r}")
    finally:
        if dist.get_rank() == 0:
            plumbing.remove(scratch)
