"""What a checkpoint ``state`` holds, and how the sharded state is read out of it.

A ``state`` passed to ``save_checkpoint``/``load_checkpoint`` is a flat dict. Its values are
sorted into four kinds (:class:`StateEntries`): exactly one *sharded model*, *optimizers*,
*lists of optimizers* (the trainer layout), and *metadata* (everything else; an object
with ``state_dict()``/``load_state_dict()`` is metadata saved through those methods).

Gathered (full) and sharded state dicts are read with torch's family-agnostic helpers in
``torch.distributed.checkpoint.state_dict``, so the same code serves FSDP1
(``FullyShardedDataParallel``, ``use_orig_params`` True or False), FSDP2 (``fully_shard``)
and tensor-parallel (DTensor) modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

__all__ = [
    "StateEntries",
    "clean_name",
    "finish_optimizer_load",
    "is_sharded_module",
    "is_stateful",
    "read_model_state",
    "reads_fsdp1_natively",
    "split_state",
    "state_dict_options",
]


def is_sharded_module(module: object) -> bool:
    """Tell whether ``module`` is a sharded model that checkpoints can save and load.

    Args:
        module: Any object.

    Returns:
        True for an FSDP1 root (``FullyShardedDataParallel``), an FSDP2 module
        (``FSDPModule``), or any ``nn.Module`` with at least one DTensor parameter
        (tensor parallelism, with or without FSDP2); False otherwise.
    """
    if isinstance(module, (FSDP, FSDPModule)):
        return True
    if not isinstance(module, nn.Module):
        return False
    return any(isinstance(p, DTensor) for p in module.parameters())


def is_stateful(obj: object) -> bool:
    """Tell whether ``obj`` is saved through its ``state_dict()``/``load_state_dict()``."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _is_optimizer_list(value: object) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(v, Optimizer) for v in value)
    )


@dataclass
class StateEntries:
    """The values of a checkpoint ``state``, sorted by kind.

    Attributes:
        model_key: The key of the one sharded model.
        model: The sharded model.
        optimizers: Key -> optimizer of the sharded model.
        optimizer_lists: Key -> list of optimizers (saved in the standard integer-keyed
            form and matched by position on load: the trainer layout).
        metadata: Key -> any other value (plain values, stateful objects, plain modules).
    """

    model_key: str
    model: nn.Module
    optimizers: dict[str, Optimizer] = field(default_factory=dict)
    optimizer_lists: dict[str, list[Optimizer]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def all_optimizers(self) -> list[Optimizer]:
        """Every optimizer: those under their own keys, then those of the lists, in order."""
        listed = [opt for opts in self.optimizer_lists.values() for opt in opts]
        return [*self.optimizers.values(), *listed]

    def regroup(self, values: list[Any]) -> dict[str, Any]:
        """Key the per-optimizer ``values`` (in :meth:`all_optimizers` order) like ``state``."""
        it = iter(values)
        grouped: dict[str, Any] = {key: next(it) for key in self.optimizers}
        for key, opts in self.optimizer_lists.items():
            grouped[key] = [next(it) for _ in opts]
        return grouped


def split_state(state: Mapping[str, Any]) -> StateEntries:
    """Sort the values of ``state`` into model, optimizers and metadata.

    Args:
        state: The checkpoint state: key -> module, optimizer, list of optimizers, or
            metadata.

    Returns:
        The sorted entries.

    Raises:
        TypeError: If ``state`` is not a mapping or has a key that is not a string.
        ValueError: If ``state`` holds no sharded model ("could not find") or more than one
            ("multiple").
    """
    if not isinstance(state, Mapping):
        raise TypeError(
            f"The checkpoint state must be a dict of key -> object, got "
            f"{type(state).__name__}. Pass e.g. {{'model': model, 'optimizer': optimizer}}."
        )
    bad_keys = [k for k in state if not isinstance(k, str)]
    if bad_keys:
        raise TypeError(
            f"Checkpoint state keys must be strings, got {bad_keys[0]!r} "
            f"({type(bad_keys[0]).__name__}). Use string keys such as 'model'."
        )
    sharded = [key for key, value in state.items() if is_sharded_module(value)]
    if not sharded:
        kinds = {key: type(value).__name__ for key, value in state.items()}
        raise ValueError(
            f"Could not find a sharded model in the checkpoint state (keys and types: "
            f"{kinds}). Pass the module returned by `setup_module`, e.g. "
            f"{{'model': model, ...}}."
        )
    if len(sharded) > 1:
        raise ValueError(
            f"Found multiple sharded models in the checkpoint state, under the keys "
            f"{sharded}; a checkpoint holds exactly one. Save the others in separate "
            f"checkpoints."
        )
    entries = StateEntries(model_key=sharded[0], model=state[sharded[0]])
    for key, value in state.items():
        if key == entries.model_key:
            continue
        if isinstance(value, Optimizer):
            entries.optimizers[key] = value
        elif _is_optimizer_list(value):
            entries.optimizer_lists[key] = list(value)
        else:
            entries.metadata[key] = value
    return entries


# [Note: cpu_offload only for accelerator shards]
# `StateDictOptions(cpu_offload=True)` with a full state dict makes FSDP1 "offload" its
# gathered tensors to CPU; when the shards already live on CPU that offload aliases storage
# that is freed right after, and the process segfaults (measured with torch 2.13 on CPU,
# gloo; the optimizer's full state dict does the same, and no offload works). So we offload
# only when the shards live on an accelerator; on CPU FSDP1's own API reads the full state
# through rank 0 (see [Note: FSDP1's full read through rank 0 on CPU]).
def _shards_on_accelerator(module: nn.Module) -> bool:
    for param in module.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        if local.device.type not in ("cpu", "meta"):
            return True
    return False


def state_dict_options(
    module: nn.Module, *, full: bool, rank0_only: bool = True
) -> StateDictOptions:
    """Options for torch's state-dict readers: gathered or sharded, offloaded when safe.

    Args:
        module: The sharded model.
        full: Gather the state (True) or keep it sharded (False).
        rank0_only: With ``full``, offload to CPU on rank 0 only when the shards live on an
            accelerator (see [Note: cpu_offload only for accelerator shards]).
    """
    offload = full and rank0_only and (_shards_on_accelerator(module) or not _fsdp1(module))
    return StateDictOptions(full_state_dict=full, cpu_offload=offload)


def reads_fsdp1_natively(module: nn.Module) -> bool:
    """Whether a full read of ``module`` through rank 0 takes FSDP1's own API (FSDP1 units
    with shards on CPU: see [Note: FSDP1's full read through rank 0 on CPU])."""
    return _fsdp1(module) and not _shards_on_accelerator(module)


def _fsdp1(module: nn.Module) -> bool:
    """Whether ``module`` holds FSDP1 units (whose offloaded full read segfaults on CPU)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(m, FullyShardedDataParallel) for m in module.modules())


def read_model_state(module: nn.Module, *, full: bool, rank0_only: bool = True) -> dict[str, Any]:
    """Read the model state dict of a sharded module (a collective: call it on every rank).

    Args:
        module: The sharded model.
        full: True for the gathered state dict (keys as in the plain model, plain
            tensors), False for the sharded one (DTensor/ShardedTensor values).
        rank0_only: With ``full`` and shards on an accelerator, offload the gathered
            state to CPU on rank 0 only (the other ranks get an empty dict). False gives
            every rank the gathered state, on the shards' device.

    Returns:
        The model state dict.
    """
    if full and rank0_only and reads_fsdp1_natively(module):
        from reference_impl.checkpoint.fsdp1_full import read_full_model

        return read_full_model(module, clean_name)
    return get_model_state_dict(
        module, options=state_dict_options(module, full=full, rank0_only=rank0_only)
    )


_WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def clean_name(name: str) -> str:
    """``name`` without the segments wrappers add (FSDP1, activation checkpointing, compile)."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)


def finish_optimizer_load(module: nn.Module, optimizer: Optimizer, osd: Mapping[str, Any]) -> None:
    """Make a just-loaded optimizer hold exactly the checkpoint's state and hyper-parameters.

    - Loading initializes the state of every trainable parameter; a parameter that had not
      stepped when the checkpoint was written (no state there) must come back without
      state, or its first real step would differ (CKPT-STRICT-3). Flattened FSDP1
      parameters (``use_orig_params=False``) keep their state as torch loaded it.
    - torch's loading path can turn tuples into lists (``betas``); each group's
      hyper-parameters are set back to the checkpoint's values as they were saved.

    Args:
        module: The sharded model.
        optimizer: The optimizer that was just loaded.
        osd: The named optimizer state dict it was loaded from (groups in the optimizer's
            order).
    """
    groups = list(osd.get("param_groups", []))
    listed = {name for group in groups for name in group.get("params", [])}
    saved = set(osd.get("state", {}))
    for name, param in module.named_parameters():
        name = clean_name(name)
        if name in listed and name not in saved:
            optimizer.state.pop(param, None)
    for group, saved_group in zip(optimizer.param_groups, groups, strict=True):
        group.update({k: v for k, v in saved_group.items() if k != "params"})
