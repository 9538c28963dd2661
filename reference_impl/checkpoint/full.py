"""The full format: one file, written by rank 0 with ``torch.save``.

Content, per key of the saved ``state``:
- the sharded model: its gathered state dict, keys as in the plain model (no wrapper
  prefixes), so ``plain_model.load_state_dict(ckpt["model"])`` works (CKPT-REKEY-2);
- an optimizer: its gathered state dict keyed by parameter names;
- a list of optimizers: a list of state dicts in the standard integer-keyed form (the
  trainer layout, CKPT-TRAINER-1);
- an object with ``state_dict()``: that dict; anything else: the value as it is.

Loading reads the file on every rank (it must be visible to all of them, as a sharded
checkpoint must be) with ``torch.load(weights_only=True, mmap=True)``, checks everything
it can before changing anything, then loads model, optimizers and metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from reference_impl.checkpoint.files import (
    PathPlan,
    rank0_run,
    safe_torch_load,
    write_file_atomically,
)
from reference_impl.checkpoint.local_shards import holds_dtensors, shard_model_state
from reference_impl.checkpoint.optimizers import (
    load_optimizer_states,
    optimizer_param_names,
    read_optimizer_states,
)
from reference_impl.checkpoint.rekey import (
    check_param_groups,
    is_standard_optimizer_state,
    to_named_optimizer_state,
    to_standard_optimizer_state,
)
from reference_impl.checkpoint.restore import check_model_keys, require_keys, restore_metadata
from reference_impl.checkpoint.state import StateEntries, is_stateful, read_model_state

__all__ = ["load_full", "load_full_model", "save_full"]

Filter = Mapping[str, Callable[[str, Any], bool]]


def _apply_filter(key: str, value: Any, filter: Filter) -> Any:
    if key not in filter:
        return value
    if not isinstance(value, Mapping):
        raise ValueError(
            f"filter[{key!r}] needs a dict-valued entry to select from, but the entry "
            f"{key!r} saves a {type(value).__name__}; remove {key!r} from the filter."
        )
    keep = filter[key]
    return {name: item for name, item in value.items() if keep(name, item)}


def save_full(
    plan: PathPlan, state: Mapping[str, Any], entries: StateEntries, filter: Filter
) -> None:
    """Gather the state and write it to one file from rank 0 (a collective).

    Args:
        plan: The agreed path; a sharded checkpoint directory there is replaced.
        state: The caller's state (its key order is kept).
        entries: ``state`` sorted by kind.
        filter: Key -> ``fn(name, value) -> bool`` selecting the entries to keep.

    Raises:
        IsADirectoryError: On every rank, if the path is a directory that is not a
            checkpoint (it is left untouched).
    """
    if plan.kind == "directory":
        raise IsADirectoryError(
            f"Cannot save a full checkpoint to {str(plan.path)!r}: it is a directory that "
            f"is not a checkpoint (left untouched). Pass a file path, or remove the "
            f"directory first."
        )
    model = entries.model
    optimizer_states = entries.regroup(
        read_optimizer_states(model, entries.all_optimizers(), full=True)
    )
    content: dict[str, Any] = {}
    for key, value in state.items():
        converted: Any
        if key == entries.model_key:
            converted = read_model_state(model, full=True)
        elif key in entries.optimizers:
            converted = optimizer_states[key]
        elif key in entries.optimizer_lists:
            named = optimizer_states[key]
            converted = [to_standard_optimizer_state(osd) if osd else osd for osd in named]
        else:
            converted = value.state_dict() if is_stateful(value) else value
        content[key] = _apply_filter(key, converted, filter)
    rank0_run(
        f"write the full checkpoint {str(plan.path)!r}",
        lambda: write_file_atomically(content, plan.temp, plan.path),
    )


def load_full_model(
    model: nn.Module, model_sd: Mapping[str, Any], *, strict: bool, where: str
) -> None:
    """Load a gathered model state dict into a sharded model (a collective).

    Args:
        model: The sharded model.
        model_sd: The gathered state dict, keys as in the plain model.
        strict: Raise ``KeyError`` on a missing or unexpected key; else load what is there.
        where: How error messages name the entry.
    """
    sharded = read_model_state(model, full=False)
    keys = check_model_keys(sharded.keys(), model_sd.keys(), strict=strict, where=where)
    if holds_dtensors(model):  # cut locally: see [Note: full state onto strided shards]
        to_load = shard_model_state(model_sd, sharded, list(sharded))
        set_model_state_dict(model, to_load, options=StateDictOptions(strict=strict))
        return
    to_load = {k: model_sd[k] for k in keys}
    if len(keys) < len(sharded):  # keep the missing ones: load their current values
        current = read_model_state(model, full=True, rank0_only=False)
        to_load = {k: to_load[k] if k in to_load else current[k] for k in sharded}
    options = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(model, to_load, options=options)


def _named(osd: Any, names: list[list[str]], where: str) -> dict[str, Any]:
    if is_standard_optimizer_state(osd):
        return to_named_optimizer_state(osd, names, where=where)
    check_param_groups(osd, names, where=where)
    return dict(osd)


def _plan_optimizers(
    entries: StateEntries, checkpoint: Mapping[str, Any], where: str
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Match every requested optimizer with its named state, checking groups first."""
    for key, opts in entries.optimizer_lists.items():
        saved = checkpoint.get(key, opts)
        if not isinstance(saved, (list, tuple)) or len(saved) != len(opts):
            count = len(saved) if isinstance(saved, (list, tuple)) else type(saved).__name__
            raise RuntimeError(
                f"The checkpoint {where} holds {count} optimizer state(s) under {key!r}, "
                f"but {len(opts)} optimizer(s) were passed to load them into; pass exactly "
                f"as many optimizers, in the order they were saved."
            )
    names = entries.regroup(optimizer_param_names(entries.model, entries.all_optimizers()))
    optimizers, osds = [], []
    for key, opt in entries.optimizers.items():
        if key in checkpoint:
            what = f"optimizer {key!r} of {where}"
            optimizers.append(opt)
            osds.append(_named(checkpoint[key], names[key], what))
    for key, opts in entries.optimizer_lists.items():
        for index, opt in enumerate(opts if key in checkpoint else []):
            what = f"optimizer {index} of {key!r} in {where}"
            optimizers.append(opt)
            osds.append(_named(checkpoint[key][index], names[key][index], what))
    return optimizers, osds


def load_full(
    plan: PathPlan, state: MutableMapping[str, Any], entries: StateEntries, *, strict: bool
) -> dict[str, Any]:
    """Load a full checkpoint file into ``state`` (a collective).

    Args:
        plan: The agreed path (a file).
        state: The caller's state; metadata is restored into it in place.
        entries: ``state`` sorted by kind.
        strict: See ``load_checkpoint``.

    Returns:
        The checkpoint's entries that ``state`` did not request.
    """
    where = repr(str(plan.path))
    checkpoint = safe_torch_load(plan.path)
    if not isinstance(checkpoint, Mapping):
        raise ValueError(
            f"The file {where} holds a {type(checkpoint).__name__}, not a checkpoint dict; "
            f"to load a bare state dict, pass the module itself as `state`."
        )
    requested = [
        entries.model_key,
        *entries.optimizers,
        *entries.optimizer_lists,
        *entries.metadata,
    ]
    if strict:
        require_keys(requested, checkpoint.keys(), where=where)
    model_sd = checkpoint.get(entries.model_key)
    if model_sd is not None and not isinstance(model_sd, Mapping):
        raise ValueError(
            f"The checkpoint {where} holds a {type(model_sd).__name__} under "
            f"{entries.model_key!r}, not a model state dict; pass the key the model was saved "
            f"under."
        )
    optimizers, osds = _plan_optimizers(entries, checkpoint, where)  # checks before loading
    if model_sd is not None:
        where_model = f"{entries.model_key!r} in {where}"
        load_full_model(entries.model, model_sd, strict=strict, where=where_model)
    load_optimizer_states(entries.model, optimizers, osds, full=True)
    restore_metadata(state, entries.metadata, checkpoint, strict=strict)
    consumed = set(requested)
    return {k: v for k, v in checkpoint.items() if k not in consumed}
