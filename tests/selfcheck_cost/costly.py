"""The reference strategies with one cost bug each (``--strategy selfcheck_cost.costly:<factory>``).

Every bug leaves the numbers right (the training, clipping and checkpoint clauses pass) and
costs memory or communication that the configuration does not need, as the field's common
sharding bugs do; ``test_planted_cost_bugs.py`` runs the cost checks against each.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from selfcheck_fsdp2.broken import _as, _reference
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

import reference_impl
from harness.contract import StrategySpec, Unsupported
from reference_impl import model_parallel_ops
from reference_impl.checkpoint.state import read_model_state
from reference_impl.fsdp import FSDPStrategy

__all__ = [
    "clips_on_full_gradients",
    "gathers_before_a_full_load",
    "gathers_before_a_sharded_save",
    "gathers_full_state_on_every_rank",
    "gathers_the_state_twice",
    "regathers_after_the_step",
    "syncs_inside_no_backward_sync",
    "zero2_for_full_shard",
]


def _norm_of_whole_gradients(grads: list[Tensor], norm_type: float, device: torch.device) -> Tensor:
    """The global norm computed from every gradient gathered whole (``full_tensor()``): the
    same number as a norm of the shards, with the whole model's gradients all-gathered."""
    whole = [g.full_tensor() if isinstance(g, DTensor) else g for g in grads]
    norm = torch.nn.utils.get_total_norm(whole, norm_type, foreach=False)
    return norm.to(device=device, dtype=torch.float32)


class _ClipsOnFullGradients:
    """``clip_gradients_norm`` as the reference does it (unscaling, the refusal of a module
    that is not the root, the scaling), but the norm of gradients gathered whole."""

    def clip_gradients_norm(self, *args: Any, **kwargs: Any) -> Tensor:
        with mock.patch.object(model_parallel_ops, "grad_norm", _norm_of_whole_gradients):
            return super().clip_gradients_norm(*args, **kwargs)  # type: ignore[misc, no-any-return]


def clips_on_full_gradients(spec: StrategySpec) -> Any:
    """COMM-2: clipping all-gathers the gradients."""
    return _as(_reference(spec), _ClipsOnFullGradients)


class _SyncsInsideNoBackwardSync:
    """``no_backward_sync`` does nothing: every micro-batch reduce-scatters its gradients
    (their sum is the same; the communication of accumulation is not saved)."""

    def no_backward_sync(self, module: nn.Module, enabled: bool) -> Any:
        if enabled:
            self._require_root(module, "no_backward_sync(enabled=True)")  # type: ignore[attr-defined]
        return contextlib.nullcontext()


def syncs_inside_no_backward_sync(spec: StrategySpec) -> Any:
    """COMM-3: gradients are reduced inside ``no_backward_sync(enabled=True)``."""
    return _as(_reference(spec), _SyncsInsideNoBackwardSync)


def _on_every_rank(module: nn.Module, *, full: bool, rank0_only: bool = True) -> Any:
    del module, rank0_only
    return StateDictOptions(full_state_dict=full, cpu_offload=False)


class _GathersFullStateOnEveryRank:
    """A full save reads the gathered state on every rank (torch's reader without
    ``rank0_only``) and writes it from rank 0: the file is right; every rank held the whole
    model and optimizer."""

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        with contextlib.ExitStack() as stack:
            for module in ("state", "optimizers"):
                where = f"reference_impl.checkpoint.{module}"
                stack.enter_context(mock.patch(f"{where}.state_dict_options", _on_every_rank))
                stack.enter_context(mock.patch(f"{where}.reads_fsdp1_natively", _never))
            super().save_checkpoint(*args, **kwargs)  # type: ignore[misc]


def _never(module: nn.Module) -> bool:
    del module
    return False


class _GathersTheStateTwice:
    """A full save first reads the gathered model state to check it (and drops it), then
    saves: the file is right, and every parameter was all-gathered twice."""

    def save_checkpoint(self, path: Any, state: Any, *args: Any, **kwargs: Any) -> None:
        read_model_state(state["model"], full=True)
        super().save_checkpoint(path, state, *args, **kwargs)  # type: ignore[misc]


def gathers_the_state_twice(spec: StrategySpec) -> Any:
    """COMM-4: a full save all-gathers the parameters twice."""
    return _as(_reference(spec), _GathersTheStateTwice)


class _GathersBeforeAShardedSave:
    """A sharded save first gathers the whole model on every rank (to log a checksum beside
    the shards) and drops it: the directory is right; every parameter crossed the ranks."""

    def save_checkpoint(self, path: Any, state: Any, *args: Any, **kwargs: Any) -> None:
        full = getattr(self, "state_dict_type", None) == "full" or not getattr(
            self, "_save_distributed_checkpoint", True
        )
        if not full:
            read_model_state(state["model"], full=True, rank0_only=False)
        super().save_checkpoint(path, state, *args, **kwargs)  # type: ignore[misc]


def gathers_before_a_sharded_save(spec: StrategySpec) -> Any:
    """COMM-5: a sharded save all-gathers every parameter."""
    return _as(_reference(spec), _GathersBeforeAShardedSave)


class _GathersBeforeAFullLoad:
    """A full load first reads the gathered model state on every rank (to compare it with
    the file) and drops it after the load: the loaded values are right; every rank held the
    whole model beside the file."""

    def load_checkpoint(self, path: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
        full = getattr(self, "state_dict_type", None) == "full" or not getattr(
            self, "_save_distributed_checkpoint", True
        )
        before = read_model_state(state["model"], full=True, rank0_only=False) if full else {}
        out = super().load_checkpoint(path, state, *args, **kwargs)  # type: ignore[misc]
        before.clear()
        return out


def gathers_before_a_full_load(spec: StrategySpec) -> Any:
    """MEM-4: a full load gathers the whole model on every rank beside the file."""
    return _as(_reference(spec), _GathersBeforeAFullLoad)


def gathers_full_state_on_every_rank(spec: StrategySpec) -> Any:
    """MEM-3: a full save gathers the whole state on every rank."""
    return _as(_reference(spec), _GathersFullStateOnEveryRank)


class _RegathersAfterTheStep:
    """After each optimizer step, gathers every unit's updated parameters ahead of the next
    forward (a "prefetch" that never reshards): values are right; between steps every rank
    holds the whole model. It reshards before a save (torch's state-dict readers need the
    sharded parameters registered)."""

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        for root in self._modules:  # type: ignore[attr-defined]
            for unit in _units(root):
                unit.reshard()
        super().save_checkpoint(*args, **kwargs)  # type: ignore[misc]

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        out = super().optimizer_step(optimizer, **kwargs)  # type: ignore[misc]
        for root in self._modules:  # type: ignore[attr-defined]
            for unit in _units(root):
                unit.unshard()
        return out


def _units(root: nn.Module) -> Iterator[FSDPModule]:
    return (m for m in root.modules() if isinstance(m, FSDPModule))


def regathers_after_the_step(spec: StrategySpec) -> Any:
    """MEM-1: parameters stay gathered between steps."""
    return _as(_reference(spec), _RegathersAfterTheStep)


def zero2_for_full_shard(spec: StrategySpec) -> Any:
    """COMM-1: ``FULL_SHARD`` is built as ``SHARD_GRAD_OP`` (ZeRO-2): the same shards at
    rest, but units stay gathered from forward to backward."""
    if spec.family != "fsdp":
        raise Unsupported("the planted cost bug is an fsdp strategy's", "family", spec.family)
    name = getattr(spec.sharding_strategy, "name", spec.sharding_strategy)
    if str(name).upper() == "FULL_SHARD":
        spec = dataclasses.replace(spec, sharding_strategy="SHARD_GRAD_OP")
    strategy = reference_impl.make_strategy(spec)
    assert isinstance(strategy, FSDPStrategy)
    return strategy
