"""Strictness rules shared by both formats, checked before anything is loaded.

- Model keys (CKPT-STRICT-1/2): with ``strict=True`` a key the model expects but the
  checkpoint lacks raises ``KeyError``, and so does a key the checkpoint has but the model
  does not; with ``strict=False`` the present keys load and the rest is left alone.
- Requested entries: a requested key missing from the checkpoint raises ``KeyError`` with
  ``strict=True`` and keeps its current value with ``strict=False``.
- Metadata (CKPT-LOAD-2): requested keys are restored into ``state`` in place (objects
  with ``load_state_dict`` through it); the rest is returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from torch import nn

from reference_impl.checkpoint.state import is_stateful

__all__ = ["check_model_keys", "require_keys", "restore_metadata"]


def _show(keys: Iterable[str], limit: int = 8) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(repr(k) for k in keys[:limit]) + more


def check_model_keys(
    expected: Iterable[str], present: Iterable[str], *, strict: bool, where: str
) -> list[str]:
    """Compare the model's state keys with the checkpoint's.

    Args:
        expected: The keys of the model's state dict (persistent buffers included,
            non-persistent ones not).
        present: The keys the checkpoint holds for the model.
        strict: Whether a difference is an error.
        where: How error messages name the model entry (e.g. ``"'model' in ckpt.pt"``).

    Returns:
        The expected keys that the checkpoint holds (the ones to load), in the order of
        ``expected``: the same on every rank, as collectives over them need.

    Raises:
        KeyError: With ``strict=True``, naming the missing or unexpected keys.
    """
    ordered = list(expected)
    expected, present = set(ordered), set(present)
    missing, unexpected = expected - present, present - expected
    if strict and missing:
        raise KeyError(
            f"Missing key(s) in the checkpoint for {where}: {_show(missing)}. The model "
            f"expects them; load with strict=False to keep their current values."
        )
    if strict and unexpected:
        raise KeyError(
            f"Unexpected key(s) in the checkpoint for {where}: {_show(unexpected)}. The "
            f"model has no such state; load with strict=False to ignore them."
        )
    return [k for k in ordered if k in present]


def require_keys(wanted: Iterable[str], available: Iterable[str], *, where: str) -> None:
    """Raise ``KeyError`` naming the first of ``wanted`` that ``available`` lacks.

    Args:
        wanted: The requested keys.
        available: The keys the checkpoint holds.
        where: How error messages name the checkpoint.
    """
    available = set(available)
    missing = [k for k in wanted if k not in available]
    if missing:
        raise KeyError(
            f"Requested key(s) {_show(missing)} are not in the checkpoint {where} (it holds "
            f"{_show(available)}). Load with strict=False to keep their current values."
        )


def restore_metadata(
    state: MutableMapping[str, Any],
    requested: Mapping[str, Any],
    loaded: Mapping[str, Any],
    *,
    strict: bool,
) -> None:
    """Restore requested metadata into ``state`` in place.

    Args:
        state: The caller's state dict (updated in place).
        requested: The metadata entries of ``state`` (key -> current value).
        loaded: The checkpoint's entries.
        strict: Passed to a plain module's ``load_state_dict``; missing keys must have been
            checked already.
    """
    for key, current in requested.items():
        if key not in loaded:
            continue
        value = loaded[key]
        if isinstance(current, nn.Module):
            current.load_state_dict(value, strict=strict)
        elif is_stateful(current):
            current.load_state_dict(value)
        else:
            state[key] = value
