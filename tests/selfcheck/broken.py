"""Deliberately broken strategies, one real bug each, for the suites' self-check.

Each ``make_<bug>(spec)`` is a strategy factory (``--strategy tests.selfcheck.broken:
make_<bug>``). It builds the reference strategy with :func:`reference_impl.make_strategy`,
then swaps in a subclass that re-introduces one bug sharded strategies have shipped before.
The spec's other family gets the reference strategy unchanged. The subclasses add no state,
so swapping the class of a built instance is safe.

Bugs, with the clause whose suite test must catch them (``BUGS``):

- ``noshard_clip``: clipping sums every rank's squared gradient norm over the world, which
  counts a replicated (``NO_SHARD``, hybrid replica) gradient once per rank: the norm is
  inflated by sqrt(world) (CLIP-1).
- ``fsdp2_local_clip``: FSDP2 clipping uses the norm of the local shard only (CLIP-1).
- ``double_checkpointing``: activation checkpointing applied twice: a checkpoint wrapper
  nested inside another (AC-1).
- ``root_only_reset``: meta-device init that materializes a wrap unit and calls
  ``reset_parameters()`` only on the unit's root module, leaving its children uninitialized
  (INIT-1).
- ``sticky_no_sync``: ``no_backward_sync`` turns gradient sync off and never restores it
  (SYNC-1).
- ``mixed_local_clip``: under ``bf16-mixed`` only, FSDP1 clipping calls torch's plain
  ``clip_grad_norm_`` on the root's parameters, which sees each rank's local shard: the norm
  is too small wherever parameters are sharded (CLIP-1). CLIP-1's Hypothesis check draws
  ``32-true`` and ``16-mixed`` only, so under ``ci`` it passes; the configuration cover
  (``suites/test_whole_configuration_space.py``) reaches ``bf16-mixed`` with a sharded strategy by
  construction and catches it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.optim import Optimizer

import reference_impl
from harness import StrategySpec
from reference_impl.fsdp import FSDPStrategy
from reference_impl.meta_init import has_meta_tensors, owns_state

__all__ = [
    "BUGS",
    "make_double_checkpointing",
    "make_fsdp2_local_clip",
    "make_mixed_local_clip",
    "make_noshard_clip",
    "make_root_only_reset",
    "make_sticky_no_sync",
]

#: bug -> the clause whose suite test must catch it
BUGS = {
    "noshard_clip": "CLIP-1",
    "fsdp2_local_clip": "CLIP-1",
    "double_checkpointing": "AC-1",
    "root_only_reset": "INIT-1",
    "sticky_no_sync": "SYNC-1",
    "mixed_local_clip": "CLIP-1",
}


def _scale_to(grads: list[Tensor], total: Tensor, max_norm: float) -> None:
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grad in grads:
        grad.mul_(coef.to(device=grad.device, dtype=grad.dtype))


class NoShardClipStrategy(FSDPStrategy):
    """Sums squared local gradient norms over the world, replicated gradients included."""

    @torch.no_grad()
    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        root = self._require_root(module, "clip_gradients_norm")
        self.precision.unscale_gradients(optimizer)
        grads = [p.grad for p in root.parameters() if p.grad is not None]
        local = sum(
            (
                torch.linalg.vector_norm(g, norm_type, dtype=torch.float32) ** norm_type
                for g in grads
            ),
            torch.zeros((), device=self.root_device),
        )
        dist.all_reduce(local)  # BUG: a replicated gradient is counted once per rank
        total = local ** (1.0 / norm_type)
        if error_if_nonfinite and not bool(torch.isfinite(total)):
            raise RuntimeError(f"The total norm {total.item()} is non-finite.")
        _scale_to(grads, total, max_norm)
        return total


def _model_parallel_class() -> type:
    from reference_impl.model_parallel import ModelParallelStrategy

    class LocalClipStrategy(ModelParallelStrategy):
        """Clips FSDP2 gradients by the norm of this rank's shard alone."""

        @torch.no_grad()
        def clip_gradients_norm(
            self,
            module: nn.Module,
            optimizer: Optimizer,
            max_norm: float,
            norm_type: float = 2.0,
            error_if_nonfinite: bool = True,
        ) -> Tensor:
            from torch.distributed.tensor import DTensor

            self.precision.unscale_gradients(optimizer)
            grads = [p.grad for p in module.parameters() if p.grad is not None]
            local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
            norms = [torch.linalg.vector_norm(g, norm_type, dtype=torch.float32) for g in local]
            total = torch.linalg.vector_norm(torch.stack(norms), norm_type)  # BUG: no reduction
            if error_if_nonfinite and not bool(torch.isfinite(total)):
                raise RuntimeError(f"The total norm {total.item()} is non-finite.")
            _scale_to(local, total, max_norm)
            return total

    return LocalClipStrategy


class DoubleCheckpointingStrategy(FSDPStrategy):
    """Applies activation checkpointing, then wraps the checkpointed modules once more."""

    def setup_module(self, module: nn.Module) -> nn.Module:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            CheckpointWrapper,
            checkpoint_wrapper,
        )

        wrapped = super().setup_module(module)
        for outer in [m for m in wrapped.modules() if isinstance(m, CheckpointWrapper)]:
            inner = outer._checkpoint_wrapped_module  # BUG: a wrapper inside the wrapper
            outer._checkpoint_wrapped_module = checkpoint_wrapper(
                inner, checkpoint_impl=CheckpointImpl.NO_REENTRANT
            )
        return wrapped


def _root_only_init(device: torch.device) -> Callable[[nn.Module], None]:
    """An FSDP1 ``param_init_fn`` that resets only the module it is first called on.

    FSDP1 calls it on the modules of a unit root first; it allocates the whole unit and
    calls the root's ``reset_parameters()`` (if any), so children stay uninitialized.
    """

    def init(module: nn.Module) -> None:
        if not has_meta_tensors(module):
            return
        for sub in module.modules():
            if owns_state(sub) and has_meta_tensors(sub):
                sub.to_empty(device=device, recurse=False)
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()  # BUG: only the unit's root is reset

    return init


class RootOnlyResetStrategy(FSDPStrategy):
    """Meta-device init that resets only each wrap unit's root module."""

    def setup_module(self, module: nn.Module) -> nn.Module:
        if not has_meta_tensors(module):
            return super().setup_module(module)
        self._fsdp_kwargs["param_init_fn"] = _root_only_init(self.root_device)
        try:
            return super().setup_module(module)
        finally:
            del self._fsdp_kwargs["param_init_fn"]


class StickyNoSyncStrategy(FSDPStrategy):
    """``no_backward_sync`` that turns sync off and does not turn it back on."""

    def no_backward_sync(self, module: nn.Module, enabled: bool) -> Any:
        if not enabled:
            return contextlib.nullcontext()
        root = self._require_root(module, "no_backward_sync(enabled=True)")
        return _sync_off(root)


@contextlib.contextmanager
def _sync_off(root: FSDP) -> Generator[None, None, None]:
    for unit in FSDP.fsdp_modules(root):
        unit._sync_gradients = False
    yield  # BUG: nothing restores _sync_gradients on exit


class MixedLocalClipStrategy(FSDPStrategy):
    """Clips with torch's plain ``clip_grad_norm_`` over local shards (swapped in under
    ``bf16-mixed`` only)."""

    @torch.no_grad()
    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        root = self._require_root(module, "clip_gradients_norm")
        self.precision.unscale_gradients(optimizer)
        return torch.nn.utils.clip_grad_norm_(root.parameters(), max_norm, norm_type)


def _swap(spec: StrategySpec, family: str, cls: type) -> Any:
    strategy = reference_impl.make_strategy(spec)
    if spec.family == family:
        strategy.__class__ = cls
    return strategy


def make_noshard_clip(spec: StrategySpec) -> Any:
    """fsdp: clipping counts replicated gradients once per rank (CLIP-1)."""
    return _swap(spec, "fsdp", NoShardClipStrategy)


def make_fsdp2_local_clip(spec: StrategySpec) -> Any:
    """model_parallel: clipping uses the local shard's norm (CLIP-1)."""
    return _swap(spec, "model_parallel", _model_parallel_class())


def make_double_checkpointing(spec: StrategySpec) -> Any:
    """fsdp: checkpoint wrappers nested in checkpoint wrappers (AC-1)."""
    return _swap(spec, "fsdp", DoubleCheckpointingStrategy)


def make_root_only_reset(spec: StrategySpec) -> Any:
    """fsdp: meta-device init resets only each wrap unit's root (INIT-1)."""
    return _swap(spec, "fsdp", RootOnlyResetStrategy)


def make_mixed_local_clip(spec: StrategySpec) -> Any:
    """fsdp, bf16-mixed: clipping with the local shards' norm (CLIP-1)."""
    strategy = reference_impl.make_strategy(spec)
    if spec.family == "fsdp" and str(spec.precision) == "bf16-mixed":
        strategy.__class__ = MixedLocalClipStrategy
    return strategy


def make_sticky_no_sync(spec: StrategySpec) -> Any:
    """fsdp: ``no_backward_sync`` never restores gradient sync (SYNC-1)."""
    return _swap(spec, "fsdp", StickyNoSyncStrategy)
