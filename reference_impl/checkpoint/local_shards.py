"""Gathered (full) state cut into the DTensor shards of a model, on every rank, locally.

A full checkpoint is read on every rank, so each rank already holds every full tensor.
For a model whose parameters are DTensors (FSDP2 and/or tensor parallelism) we cut this
rank's shard out of each full tensor ourselves and load the result as a *sharded* state
dict, instead of handing the full state to torch's full-state loaders.

[Note: full state onto strided shards]
``set_model_state_dict``/``set_optimizer_state_dict`` with ``full_state_dict=True`` (and no
``broadcast_from_rank0``) place each full tensor with ``distribute_tensor`` and its default
``src_data_rank=0``: a scatter from the first rank of every mesh dim. FSDP2 on a 2-D mesh
whose tensor-parallel plan shards the same tensor dim (``fc1``: ``Shard(0)``) gives the
parameter ``_StridedShard(0, split_factor=tp)`` on the data-parallel dim. In torch 2.13
``_StridedShard._split_tensor(with_padding=True)`` returns the pad sizes but not padded
shards, so when that dim does not split evenly (ffn=2 on a 2 x 2 mesh: shards of 2 and 0
rows) ``_StridedShard._shard_tensor`` finds a scatter list of unequal shapes and raises a
bare ``AssertionError`` (``torch/distributed/tensor/placement_types.py``). With
``src_data_rank=None`` ``distribute_tensor`` only splits locally (no padding needed, so
uneven shards are fine) and communicates nothing, which is all a full load needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.tensor import DTensor, distribute_tensor

from reference_impl.checkpoint.state import clean_name

__all__ = ["holds_dtensors", "shard_like", "shard_model_state", "shard_optimizer_state"]


def holds_dtensors(module: nn.Module) -> bool:
    """Whether ``module``'s sharded state is DTensors (FSDP2/tensor parallel, not FSDP1)."""
    if FSDP.fsdp_modules(module):
        return False
    return any(isinstance(p, DTensor) for p in module.parameters())


def shard_like(full: Tensor, like: DTensor, *, name: str) -> DTensor:
    """This rank's shard of ``full``, placed as ``like`` is (no communication).

    Args:
        full: The whole tensor (the same on every rank).
        like: A DTensor whose mesh, placements and global shape the result takes.
        name: How error messages name the tensor.

    Raises:
        RuntimeError: If ``full``'s shape is not ``like``'s global shape.
    """
    if tuple(full.shape) != tuple(like.shape):
        raise RuntimeError(
            f"size mismatch for {name}: the checkpoint holds shape {tuple(full.shape)}, the "
            f"model's tensor has shape {tuple(like.shape)}; load a checkpoint of the same "
            f"model."
        )
    # see [Note: full state onto strided shards]
    shard = distribute_tensor(full.detach(), like.device_mesh, like.placements, src_data_rank=None)
    local, expected = shard.to_local(), like.to_local()
    if local.shape != expected.shape:  # an invariant of torch's placement arithmetic
        raise RuntimeError(
            f"Cutting {name} of shape {tuple(full.shape)} for placements {like.placements} "
            f"gave a local shard of shape {tuple(local.shape)}, but this rank holds "
            f"{tuple(expected.shape)}; torch placed the shard differently from the model."
        )
    return shard


def shard_model_state(
    full: Mapping[str, Any], sharded: Mapping[str, Any], keys: list[str]
) -> dict[str, Any]:
    """A sharded model state dict holding ``full``'s values.

    Args:
        full: The gathered state dict (plain tensors, the same on every rank).
        sharded: The model's own sharded state dict (DTensors where it is sharded).
        keys: The keys to load, in the model's order. A key that ``full`` lacks keeps the
            model's current value.

    Returns:
        Key -> this rank's shard (a DTensor) where the model holds a DTensor, else the full
        value.
    """
    result: dict[str, Any] = {}
    for key in keys:
        target = sharded[key]
        if key not in full:
            result[key] = target
        elif isinstance(target, DTensor) and isinstance(full[key], Tensor):
            result[key] = shard_like(full[key], target, name=repr(key))
        else:
            result[key] = full[key]
    return result


def shard_optimizer_state(module: nn.Module, osd: Mapping[str, Any]) -> dict[str, Any]:
    """A named optimizer state dict with each full state tensor cut like its parameter.

    A state tensor of its parameter's global shape (``exp_avg``, ``momentum_buffer``) is
    sharded as the parameter is; other values (``step``, scalars) stay as they are.

    Args:
        module: The model whose parameters the optimizer steps.
        osd: ``{"state": {name: {key: value}}, "param_groups": [...]}`` with full tensors.
    """
    params = {
        clean_name(name): param
        for name, param in module.named_parameters(remove_duplicate=False)
        if isinstance(param, DTensor)
    }
    state: dict[str, Any] = {}
    for name, values in osd.get("state", {}).items():
        param = params.get(name)
        if param is None or not isinstance(values, Mapping):
            state[name] = values
            continue
        state[name] = {
            key: shard_like(value, param, name=f"optimizer state {key!r} of {name!r}")
            if isinstance(value, Tensor) and value.dim() > 0 and value.shape == param.shape
            else value
            for key, value in values.items()
        }
    return {**osd, "state": state}
