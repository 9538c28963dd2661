"""``save_checkpoint`` and ``load_checkpoint``: argument checks, then the format's module.

Both are collectives: every rank calls them with the same ``state`` keys; the path is
rank 0's (CKPT-SAVE-2). Errors about the arguments are raised before any communication, on
every rank alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from torch import nn
from torch.optim import Optimizer

from reference_impl.checkpoint.files import PathPlan, agree_on_path, safe_torch_load
from reference_impl.checkpoint.full import load_full, load_full_model, save_full
from reference_impl.checkpoint.sharded import load_sharded, save_sharded
from reference_impl.checkpoint.state import is_sharded_module, split_state

__all__ = ["load_checkpoint", "save_checkpoint"]


def _check_filter(filter: Any, state: Mapping[str, Any], full: bool) -> None:
    if filter is None:
        return
    if not full:
        raise NotImplementedError(
            f"filter={filter!r} is only supported for full checkpoints; a sharded "
            f"checkpoint saves every entry. Save with the full format to filter, or drop "
            f"the filter."
        )
    if not isinstance(filter, Mapping):
        raise TypeError(
            f"filter must be a dict of state key -> fn(name, value) -> bool, got "
            f"{type(filter).__name__}."
        )
    for key, fn in filter.items():
        if key not in state:
            raise ValueError(
                f"filter names the key {key!r}, which is not in the checkpoint state (keys: "
                f"{list(state)}); filter only keys you save."
            )
        if not callable(fn):
            raise TypeError(
                f"filter[{key!r}] must be a callable fn(name, value) -> bool, got {fn!r}."
            )


def save_checkpoint(
    path: str | os.PathLike[str],
    state: Mapping[str, Any],
    *,
    full: bool,
    filter: Mapping[str, Callable[[str, Any], bool]] | None = None,
) -> None:
    """Save ``state`` (one sharded model, its optimizers, metadata) to ``path``.

    Args:
        path: Where to save; rank 0's path is used on every rank. Full: a file (an existing
            file or sharded checkpoint there is replaced). Sharded: a directory (an existing
            file or sharded checkpoint there is replaced).
        state: Key -> the sharded model (exactly one), optimizers of it, lists of
            optimizers (saved in the standard integer-keyed form: the trainer layout),
            objects with ``state_dict()`` (saved through it) or plain values.
        full: True for one file written by rank 0, False for a sharded directory.
        filter: Full format only: key -> ``fn(name, value) -> bool`` keeping the selected
            entries of that key's dict.

    Raises:
        TypeError: If ``state``, ``path`` or ``filter`` has the wrong type.
        ValueError: If ``state`` holds no sharded model or several, or ``filter`` names a key
            that ``state`` lacks.
        NotImplementedError: If ``filter`` is given with ``full=False``.
        IsADirectoryError: Full format, if ``path`` is a directory that is not a checkpoint.
        RuntimeError: If ``torch.distributed.checkpoint`` or the write on rank 0 fails.
    """
    entries = split_state(state)
    _check_filter(filter, state, full)
    plan = agree_on_path(path)
    if full:
        save_full(plan, state, entries, filter or {})
    else:
        save_sharded(plan, state, entries)


def _not_a_checkpoint(plan: PathPlan) -> ValueError:
    what = {
        "missing": "nothing exists there",
        "directory": "it is a directory without torch.distributed.checkpoint's .metadata file",
    }.get(plan.kind, plan.kind)
    return ValueError(
        f"The checkpoint path {str(plan.path)!r} is neither a checkpoint file nor a sharded "
        f"checkpoint directory ({what}). Pass the path that save_checkpoint wrote."
    )


def _load_bare_module(plan: PathPlan, module: nn.Module, strict: bool) -> dict[str, Any]:
    if plan.kind in ("sharded", "directory"):
        raise ValueError(
            f"Cannot load a bare module from the directory {str(plan.path)!r}: a bare module "
            f"loads from a file that holds its state dict (as torch.save(model.state_dict(), "
            f"path) writes). To load a checkpoint directory, pass state={{'model': module}}."
        )
    if plan.kind != "file":
        raise _not_a_checkpoint(plan)
    state_dict = safe_torch_load(plan.path)
    if not isinstance(state_dict, Mapping):
        raise ValueError(
            f"The file {str(plan.path)!r} holds a {type(state_dict).__name__}, not a state "
            f"dict; a bare module loads from torch.save(model.state_dict(), path)."
        )
    if is_sharded_module(module):
        load_full_model(module, state_dict, strict=strict, where=repr(str(plan.path)))
    else:
        module.load_state_dict(state_dict, strict=strict)
    return {}


def load_checkpoint(
    path: str | os.PathLike[str],
    state: MutableMapping[str, Any] | nn.Module | Optimizer | None,
    *,
    strict: bool,
) -> dict[str, Any]:
    """Load a full or sharded checkpoint into ``state``, at any world size.

    Args:
        path: A full checkpoint file or a sharded checkpoint directory (rank 0's path is
            used on every rank).
        state: Key -> the sharded model, its optimizers (or lists of optimizers) and
            requested metadata; or a bare module, loaded from a file that holds its state
            dict itself.
        strict: True: a model key missing from the checkpoint or unexpected in it, or a
            requested key missing from it, raises ``KeyError``. False: present keys load,
            missing ones keep their current values, unexpected ones are ignored.

    Returns:
        The checkpoint's metadata that ``state`` did not request (requested metadata is
        restored into ``state`` in place; objects with ``load_state_dict`` through it).

    Raises:
        ValueError: Empty ``state``; no sharded model or several; a path that is no
            checkpoint; a directory for a bare module; mismatched optimizer parameter groups.
        NotImplementedError: If ``state`` is a bare optimizer.
        KeyError: With ``strict=True``, naming a missing or unexpected key.
        RuntimeError: A count of optimizers different from the checkpoint's, or a failure
            of ``torch.distributed.checkpoint``.
        pickle.UnpicklingError: If the checkpoint needs arbitrary unpickling.
    """
    if state is None or (isinstance(state, Mapping) and not state):
        raise ValueError(
            f"load_checkpoint(..., state={state!r}) needs a state to load into, with at "
            f"least the model: pass e.g. {{'model': model, 'optimizer': optimizer}}."
        )
    if isinstance(state, Optimizer):
        raise NotImplementedError(
            "Loading a bare optimizer is not supported: its state is keyed by the model's "
            "parameter names. Pass state={'model': model, 'optimizer': optimizer}."
        )
    if isinstance(state, nn.Module):
        return _load_bare_module(agree_on_path(path), state, strict)
    entries = split_state(state)
    plan = agree_on_path(path)
    if plan.kind == "sharded":
        return load_sharded(plan, state, entries, strict=strict)
    if plan.kind == "file":
        return load_full(plan, state, entries, strict=strict)
    raise _not_a_checkpoint(plan)
