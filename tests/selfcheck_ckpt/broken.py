"""Deliberately broken strategies: the reference strategies with one checkpoint bug each.

Each factory builds the reference strategy with ``reference_impl.make_strategy`` and gives
it a subclass whose one overridden method carries the bug, so both families are covered.
``tests/selfcheck_ckpt/test_broken_strategies_caught.py`` runs the checkpoint suites
against each (``--strategy selfcheck_ckpt.broken:<factory>``) on the clause it breaks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

import reference_impl
from harness.contract import StrategySpec

__all__ = [
    "deletes_old_checkpoint_first",
    "drops_saved_metadata",
    "ignores_metadata",
    "local_shard_optimizer",
    "rekeys_in_parameters_order",
    "skips_optimizer_in_full_format",
    "skips_stateful_metadata",
    "strict_false_raises_on_missing_keys",
]

_WRAPPERS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def _clean(name: str) -> str:
    return ".".join(p for p in name.split(".") if p not in _WRAPPERS)


def _with_bug(spec: StrategySpec, bug: type) -> Any:
    """The reference strategy for ``spec``, as an instance of ``bug`` + its own class.

    The reference object is built by ``reference_impl.make_strategy`` and its state moved
    into an instance of the subclass (``__class__`` assignment refuses mixed layouts).
    """
    reference = reference_impl.make_strategy(spec)
    cls = type(f"{bug.__name__}{type(reference).__name__}", (bug, type(reference)), {})
    strategy: Any = object.__new__(cls)
    strategy.__dict__.update(reference.__dict__)
    return strategy


def _is_optimizer(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(v, Optimizer) for v in value)
    return isinstance(value, Optimizer)


class LocalShardOptimizer:
    """Sharded format: each rank saves its optimizer's own ``state_dict()`` (its local shard)
    beside the checkpoint and loads its own file back. Fine at one world size; at another
    the shards no longer fit (or a rank finds no file)."""

    def save_checkpoint(
        self, path: Any, state: dict, storage_options: Any = None, filter: Any = None
    ) -> None:
        if self._full_checkpoint:  # type: ignore[attr-defined]
            return super().save_checkpoint(path, state, storage_options, filter)  # type: ignore[misc]
        rest = {k: v for k, v in state.items() if not isinstance(v, Optimizer)}
        super().save_checkpoint(path, rest, storage_options, filter)  # type: ignore[misc]
        for key, value in state.items():
            if isinstance(value, Optimizer):
                torch.save(value.state_dict(), Path(path) / f"{key}-rank{dist.get_rank()}.pt")
        dist.barrier()

    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True) -> Any:
        if not (isinstance(state, dict) and Path(path).is_dir()):
            return super().load_checkpoint(path, state, strict)  # type: ignore[misc]
        rest = {k: v for k, v in state.items() if not isinstance(v, Optimizer)}
        returned = super().load_checkpoint(path, rest, strict)  # type: ignore[misc]
        state.update(rest)
        for key, value in state.items():
            if isinstance(value, Optimizer):
                local = Path(path) / f"{key}-rank{dist.get_rank()}.pt"
                value.load_state_dict(torch.load(local, weights_only=False))
        return returned


class IgnoresMetadata:
    """Loads model and optimizers but never restores requested metadata into ``state``."""

    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True) -> Any:
        if not isinstance(state, dict):
            return super().load_checkpoint(path, state, strict)  # type: ignore[misc]
        objects = {k: v for k, v in state.items() if isinstance(v, nn.Module) or _is_optimizer(v)}
        return super().load_checkpoint(path, objects, strict)  # type: ignore[misc]


class StrictFalseRaises:
    """``strict=False`` on a sharded checkpoint still raises for a model key it lacks."""

    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True) -> Any:
        if not strict and isinstance(state, dict) and Path(path).is_dir():
            from torch.distributed.checkpoint import FileSystemReader
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            key, model = next((k, v) for k, v in state.items() if isinstance(v, nn.Module))
            stored = FileSystemReader(os.fspath(path)).read_metadata().state_dict_metadata
            saved = {k[len(key) + 1 :] for k in stored if k.startswith(f"{key}.")}
            missing = sorted(set(get_model_state_dict(model)) - saved)
            if missing:
                raise KeyError(f"Missing key(s) in the checkpoint: {missing}")
        return super().load_checkpoint(path, state, strict)  # type: ignore[misc]


class RekeysInParametersOrder:
    """Integer optimizer ids are mapped to names in ``model.parameters()`` order instead of
    ``param_groups`` order."""

    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True) -> Any:
        model = None
        if isinstance(state, dict):
            model = next((v for v in state.values() if isinstance(v, nn.Module)), None)
        if model is None:
            return super().load_checkpoint(path, state, strict)  # type: ignore[misc]
        with _rekey_by_order([_clean(n) for n, _ in model.named_parameters()]):
            return super().load_checkpoint(path, state, strict)  # type: ignore[misc]


@contextlib.contextmanager
def _rekey_by_order(order: list[str]) -> Iterator[None]:
    from reference_impl.checkpoint import full

    def rekey(standard: Any, group_names: Any, *, where: str = "") -> dict[str, Any]:
        wanted = {n for names in group_names for n in names}
        by_order = [n for n in order if n in wanted]  # the bug: parameters() order
        groups = [
            {**g, "params": list(names)}
            for g, names in zip(standard["param_groups"], group_names, strict=True)
        ]
        return {
            "state": {by_order[i]: v for i, v in standard["state"].items()},
            "param_groups": groups,
        }

    with mock.patch.object(full, "to_named_optimizer_state", rekey):
        yield


class SkipsFullOptimizer:
    """Full format: loads model and metadata, silently skips the optimizer state."""

    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True) -> Any:
        if not (isinstance(state, dict) and Path(path).is_file()):
            return super().load_checkpoint(path, state, strict)  # type: ignore[misc]
        rest = {k: v for k, v in state.items() if not _is_optimizer(v)}
        returned = super().load_checkpoint(path, rest, strict)  # type: ignore[misc]
        state.update(rest)
        return {k: v for k, v in returned.items() if k not in state}


class SkipsStatefulMetadata:
    """Saves objects with ``state_dict()``/``load_state_dict()`` (a learning-rate scheduler)
    but never restores them on load: the caller's object is left as it was, so a resumed
    run restarts its scheduler's warmup. Everything else loads as the reference loads it."""

    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True) -> Any:
        if not isinstance(state, dict):
            return super().load_checkpoint(path, state, strict)  # type: ignore[misc]
        rest = {k: v for k, v in state.items() if not _is_stateful_metadata(v)}
        returned = super().load_checkpoint(path, rest, strict)  # type: ignore[misc]
        state.update(rest)
        return {k: v for k, v in returned.items() if k not in state}


def _is_stateful_metadata(value: Any) -> bool:
    if isinstance(value, nn.Module) or _is_optimizer(value):
        return False
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


class DropsSavedMetadata:
    """After saving, removes the metadata entries it wrote from the caller's ``state`` (a save
    that pops entries while building its file)."""

    def save_checkpoint(
        self, path: Any, state: dict, storage_options: Any = None, filter: Any = None
    ) -> None:
        super().save_checkpoint(path, state, storage_options, filter)  # type: ignore[misc]
        for key in [k for k, v in state.items() if not isinstance(v, nn.Module)]:
            if not _is_optimizer(state[key]):
                del state[key]


class DeletesOldCheckpointFirst:
    """Removes what is at the path, then writes the new checkpoint there: a write that fails
    loses the old checkpoint and the new one (how several trainers save)."""

    def save_checkpoint(
        self, path: Any, state: dict, storage_options: Any = None, filter: Any = None
    ) -> None:
        target = Path(path)
        if dist.get_rank() == 0 and target.is_dir():
            shutil.rmtree(target)
        elif dist.get_rank() == 0 and target.exists():
            target.unlink()
        dist.barrier()
        super().save_checkpoint(path, state, storage_options, filter)  # type: ignore[misc]


def local_shard_optimizer(spec: StrategySpec) -> Any:
    """Factory: :class:`LocalShardOptimizer` (breaks CKPT-RT-3)."""
    return _with_bug(spec, LocalShardOptimizer)


def ignores_metadata(spec: StrategySpec) -> Any:
    """Factory: :class:`IgnoresMetadata` (breaks CKPT-LOAD-2)."""
    return _with_bug(spec, IgnoresMetadata)


def strict_false_raises_on_missing_keys(spec: StrategySpec) -> Any:
    """Factory: :class:`StrictFalseRaises` (breaks CKPT-STRICT-2)."""
    return _with_bug(spec, StrictFalseRaises)


def rekeys_in_parameters_order(spec: StrategySpec) -> Any:
    """Factory: :class:`RekeysInParametersOrder` (breaks CKPT-REKEY-1)."""
    return _with_bug(spec, RekeysInParametersOrder)


def skips_optimizer_in_full_format(spec: StrategySpec) -> Any:
    """Factory: :class:`SkipsFullOptimizer` (breaks CKPT-RT-1)."""
    return _with_bug(spec, SkipsFullOptimizer)


def skips_stateful_metadata(spec: StrategySpec) -> Any:
    """Factory: :class:`SkipsStatefulMetadata` (breaks CKPT-SAVE-4)."""
    return _with_bug(spec, SkipsStatefulMetadata)


def drops_saved_metadata(spec: StrategySpec) -> Any:
    """Factory: :class:`DropsSavedMetadata` (breaks CKPT-SAVE-7)."""
    return _with_bug(spec, DropsSavedMetadata)


def deletes_old_checkpoint_first(spec: StrategySpec) -> Any:
    """Factory: :class:`DeletesOldCheckpointFirst` (breaks CKPT-SAVE-6)."""
    return _with_bug(spec, DeletesOldCheckpointFirst)
