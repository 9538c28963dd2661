"""Loading the checkpoints of :mod:`independent.solo_fsdp2` (either format, any world size).

Each rank reads a full file itself (memory-mapped) and cuts its own shards with
``distribute_tensor(..., src_data_rank=None)``; a sharded directory is read with
``torch.distributed.checkpoint`` into the module's shards in place and into tensors of each
parameter's placement for the optimizer state. Saved optimizer state is paired with the
optimizer's parameters by position in ``param_groups``, so names and integer ids both load.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim import Optimizer

from independent import plumbing
from independent.solo_fsdp2_ckpt import groups_keyed, ordered_params, param_names

__all__ = ["load", "load_full_model"]


def load(
    path: str, state: dict[str, Any], key: str, optimizers: dict[str, Any], strict: bool
) -> dict[str, Any]:
    """Load a full file or a sharded directory into ``state`` in place; returns every saved
    entry (the caller restores metadata from it)."""
    module = state[key]
    if plumbing.is_sharded_checkpoint(path):
        return _load_sharded(path, key, module, optimizers, strict)
    if not os.path.isfile(path):
        raise ValueError(f"{path!r} is neither a checkpoint file nor a sharded checkpoint.")
    saved = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    if key not in saved:
        raise KeyError(f"the checkpoint {path!r} holds no model under {key!r}")
    load_full_model(module, saved[key], strict)
    for name, value in optimizers.items():
        if name not in saved:
            if strict:
                raise KeyError(f"the checkpoint holds no optimizer state under {name!r}")
            continue
        pairs = _paired(name, value, saved[name])
        for optimizer, osd in pairs:
            _load_full_optimizer(optimizer, osd)
    return dict(saved)


def _paired(name: str, value: Any, saved: Any) -> list[tuple[Optimizer, Any]]:
    if isinstance(value, Optimizer):
        return [(value, saved)]
    if not isinstance(saved, list) or len(saved) != len(value):
        count = len(saved) if isinstance(saved, list) else 1
        raise RuntimeError(
            f"the checkpoint holds {count} optimizers under {name!r}, state passes {len(value)}."
        )
    return list(zip(value, saved, strict=True))


def _check_keys(expected: set[str], found: set[str], strict: bool, where: str) -> None:
    missing, unexpected = sorted(expected - found), sorted(found - expected)
    if strict and (missing or unexpected):
        raise KeyError(
            f"{where}: missing model keys {missing}, unexpected keys {unexpected}; "
            "pass strict=False to load what matches."
        )


def load_full_model(module: nn.Module, saved: dict[str, Any], strict: bool) -> None:
    """Copy a full state dict into the sharded module, each rank cutting its own shard."""
    current = module.state_dict()
    _check_keys(set(current), set(saved), strict, "the model")
    with torch.no_grad():
        for name, tensor in current.items():
            if name not in saved:
                continue
            _copy_into(tensor, saved[name])


def _copy_into(tensor: torch.Tensor, value: torch.Tensor) -> None:
    if tuple(value.shape) != tuple(tensor.shape):
        raise RuntimeError(
            f"shape {tuple(value.shape)} in the checkpoint, {tuple(tensor.shape)} here"
        )
    if isinstance(tensor, DTensor):
        value = distribute_tensor(
            value.to(tensor.dtype), tensor.device_mesh, tensor.placements, src_data_rank=None
        )
        tensor.to_local().copy_(value.to_local())
    else:
        tensor.copy_(value)


def _shard_like(param: Any, key: str, value: Any) -> Any:
    """A saved optimizer value placed as its parameter is (as ``Optimizer.load_state_dict``
    casts: floating state to the parameter's dtype, ``step`` left as it is)."""
    if not isinstance(value, torch.Tensor):
        return value
    if key == "step" or tuple(value.shape) != tuple(param.shape):
        return value.clone()
    value = value.to(param.dtype) if value.is_floating_point() else value
    if isinstance(param, DTensor):
        return distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
    return value.to(param.device, copy=True)


def _samegroups_keyed(optimizer: Optimizer, groups: list[dict[str, Any]]) -> None:
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(
            f"the checkpoint has {len(groups)} parameter groups, the optimizer "
            f"{len(optimizer.param_groups)}; build the optimizer as it was saved."
        )
    for i, (group, saved) in enumerate(zip(optimizer.param_groups, groups, strict=True)):
        if len(group["params"]) != len(saved["params"]):
            raise ValueError(
                f"parameter group {i} holds {len(group['params'])} parameters, the "
                f"checkpoint's {len(saved['params'])}; build the optimizer as it was saved."
            )


def _setgroups_keyed(optimizer: Optimizer, groups: list[dict[str, Any]]) -> None:
    for group, saved in zip(optimizer.param_groups, groups, strict=True):
        group.update({k: v for k, v in saved.items() if k != "params"})


def _load_full_optimizer(optimizer: Optimizer, osd: dict[str, Any]) -> None:
    """Saved state (keyed by name or by integer id) onto the optimizer's parameters: the
    saved groups' ``params`` lists pair each key with a parameter by position."""
    groups = osd.get("param_groups", [])
    _samegroups_keyed(optimizer, groups)
    by_key: dict[Any, Any] = {}
    for group, saved in zip(optimizer.param_groups, groups, strict=True):
        by_key.update(zip(saved["params"], group["params"], strict=True))
    state = {}
    for saved_key, entry in osd.get("state", {}).items():
        if saved_key not in by_key:
            raise KeyError(f"optimizer state for {saved_key!r}, which no parameter group lists")
        param = by_key[saved_key]
        state[param] = {k: _shard_like(param, k, v) for k, v in entry.items()}
    optimizer.state.clear()
    optimizer.state.update(state)
    _setgroups_keyed(optimizer, groups)


def _load_sharded(
    path: str, key: str, module: nn.Module, optimizers: dict[str, Any], strict: bool
) -> dict[str, Any]:
    stored = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    model = module.state_dict()
    on_disk = {s[len(key) + 1 :] for s in stored if s.startswith(f"{key}.")}
    _check_keys(set(model), on_disk, strict, f"the sharded checkpoint {path!r}")
    target: dict[str, Any] = {key: {n: t for n, t in model.items() if n in on_disk}}
    for name, value in optimizers.items():
        if isinstance(value, Optimizer):
            target[name] = _optimizer_target(module, value, f"{name}.", stored)
            continue
        count = len({s.split(".")[1] for s in stored if s.startswith(f"{name}.")})
        if count != len(value):
            raise RuntimeError(
                f"the checkpoint holds {count} optimizers under {name!r}, "
                f"state passes {len(value)}."
            )
        target[name] = [
            _optimizer_target(module, o, f"{name}.{i}.", stored) for i, o in enumerate(value)
        ]
    try:  # loads the model's shards in place
        dcp.load(
            target, checkpoint_id=path, planner=dcp.DefaultLoadPlanner(allow_partial_load=True)
        )
    except dcp.CheckpointException as exc:
        raise RuntimeError(f"reading the sharded checkpoint {path!r} failed: {exc}") from None
    names = param_names(module)
    for name, value in optimizers.items():
        pairs = _paired(name, value, target[name])
        for optimizer, osd in pairs:
            _samegroups_keyed(optimizer, osd["param_groups"])
            by_name = {names[id(p)]: p for p in ordered_params(optimizer) if id(p) in names}
            optimizer.state.clear()
            optimizer.state.update({by_name[n]: entry for n, entry in osd["state"].items()})
            _setgroups_keyed(optimizer, osd["param_groups"])
    meta = torch.load(os.path.join(path, "meta.pt"), weights_only=True)
    return {**meta, **target}


def _optimizer_target(
    module: nn.Module, optimizer: Optimizer, prefix: str, stored: Any
) -> dict[str, Any]:
    """What DCP reads one optimizer into: a tensor of its parameter's placement for each
    saved state entry (the state keyed by the parameter itself), the groups as they are."""
    head = f"{prefix}param_groups."
    count = len({s[len(head) :].split(".")[0] for s in stored if s.startswith(head)})
    if count != len(optimizer.param_groups):
        raise ValueError(
            f"the checkpoint has {count} parameter groups, the optimizer "
            f"{len(optimizer.param_groups)}; build the optimizer as it was saved."
        )
    names = param_names(module)
    params = ordered_params(optimizer)
    keys = [names.get(id(p), f"<foreign {i}>") for i, p in enumerate(params)]
    state: dict[Any, Any] = {}
    for name, param in zip(keys, params, strict=True):
        start = f"{prefix}state.{name}."
        entry: dict[str, Any] = {}
        for fqn in (s for s in stored if s.startswith(start)):
            meta, what = stored[fqn], fqn[len(start) :]
            if not isinstance(meta, TensorStorageMetadata):
                entry[what] = None  # a plain value, read as it was saved
            elif what != "step" and tuple(meta.size) == tuple(param.shape):
                entry[what] = torch.zeros_like(param, dtype=meta.properties.dtype)
            else:
                entry[what] = torch.zeros(meta.size, dtype=meta.properties.dtype)
        if entry:
            state[name] = entry
    return {"state": state, "param_groups": groups_keyed(optimizer, keys)}
