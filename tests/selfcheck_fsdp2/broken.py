"""The reference FSDP2 strategy with one FSDP2-specific bug each (``--strategy
selfcheck_fsdp2.broken:<factory>``); ``test_planted_fsdp2_bugs.py`` runs the fsdp2 suite
against each on the clause it breaks. The other families are left out (``Unsupported``)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

import reference_impl
from harness.contract import StrategySpec, Unsupported
from reference_impl import fsdp2 as fsdp2_module
from reference_impl.fsdp2 import FSDP2Strategy

__all__ = [
    "hsdp_replicas_never_all_reduce",
    "ignores_module_wrap_policy",
    "ignores_reshard_after_forward",
    "ignores_the_mesh_tuple",
    "leaves_a_unit_unwrapped",
    "reduces_in_float32",
    "rewraps_the_users_units",
    "writes_running_var_low",
]


def _reference(spec: StrategySpec) -> FSDP2Strategy:
    if spec.family != "fsdp2":
        raise Unsupported("the planted bugs are FSDP2's", "family", spec.family)
    strategy = reference_impl.make_strategy(spec)
    assert isinstance(strategy, FSDP2Strategy)
    return strategy


def _as(strategy: FSDP2Strategy, bug: type) -> Any:
    cls = type(f"{bug.__name__}FSDP2Strategy", (bug, FSDP2Strategy), {})
    broken: Any = object.__new__(cls)
    broken.__dict__.update(strategy.__dict__)
    return broken


class _SkipsFirstUnit:
    """The first module of the wrap policy is never given its own ``fully_shard``."""

    def setup_module(self, module: nn.Module) -> nn.Module:
        def fewer(root: nn.Module, policy: Any) -> list[nn.Module]:
            return fsdp2_units_of(root, policy)[1:]

        with mock.patch.object(fsdp2_module, "units_of", fewer):
            return super().setup_module(module)  # type: ignore[misc]


fsdp2_units_of = fsdp2_module.units_of


def leaves_a_unit_unwrapped(spec: StrategySpec) -> Any:
    """FSDP2-1: one unit of the policy left unwrapped."""
    return _as(_reference(spec), _SkipsFirstUnit)


def ignores_reshard_after_forward(spec: StrategySpec) -> Any:
    """FSDP2-2: every unit reshards after forward, whatever ``reshard_after_forward`` says."""
    strategy = _reference(spec)
    strategy.reshard_after_forward = True
    return strategy


class _ReducesInFloat32:
    """The mixed-precision policy keeps the low parameter dtype but reduces in float32."""

    @property
    def mp_policy(self) -> MixedPrecisionPolicy:
        low = self.precision.compute_dtype  # type: ignore[attr-defined]
        return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)


def reduces_in_float32(spec: StrategySpec) -> Any:
    """FSDP2-4: gradients reduced in float32 under a mixed precision."""
    return _as(_reference(spec), _ReducesInFloat32)


class _NoReplicaAllReduce:
    """HSDP units reduce-scatter within the shard group but never all-reduce across replicas."""

    def setup_module(self, module: nn.Module) -> nn.Module:
        result = super().setup_module(module)  # type: ignore[misc]
        for sub in result.modules():
            if isinstance(sub, FSDPModule):
                sub.set_requires_all_reduce(False, recurse=False)
        return result


def hsdp_replicas_never_all_reduce(spec: StrategySpec) -> Any:
    """FSDP2-3: the replicas of an HSDP mesh train apart."""
    return _as(_reference(spec), _NoReplicaAllReduce)


class _WritesRunningVarLow:
    """A full save under a mixed precision writes every BatchNorm ``running_var`` in the
    compute dtype (the class of pytorch#93391: a module's second floating buffer left in the
    low dtype); a load casts it back, so only the file as written shows it."""

    def save_checkpoint(self, path: Any, state: dict, *args: Any, **kwargs: Any) -> None:
        super().save_checkpoint(path, state, *args, **kwargs)  # type: ignore[misc]
        precision = self.precision  # type: ignore[attr-defined]
        if not self._full_checkpoint or not precision.is_mixed:  # type: ignore[attr-defined]
            return
        if torch.distributed.get_rank() == 0:
            content = torch.load(path, weights_only=True)
            for key in [k for k in content if isinstance(content[k], dict)]:
                for name, value in content[key].items():
                    if name.endswith("running_var"):
                        content[key][name] = value.to(precision.compute_dtype)
            torch.save(content, path)
        torch.distributed.barrier()


def writes_running_var_low(spec: StrategySpec) -> Any:
    """PREC-4: running variances written in the compute dtype (fsdp and fsdp2 families)."""
    if spec.family == "model_parallel":
        raise Unsupported("the planted bug is the self-sharding families'", "family", spec.family)
    reference = reference_impl.make_strategy(spec)
    cls = type(
        f"_WritesRunningVarLow{type(reference).__name__}",
        (_WritesRunningVarLow, type(reference)),
        {},
    )
    broken: Any = object.__new__(cls)
    broken.__dict__.update(reference.__dict__)
    return broken


class _RewrapsUsersUnits:
    """``setup_module`` does not see the user's ``fully_shard`` units: the wrap policy is
    applied as if there were none (no warning), on top of them. Only the units themselves
    are skipped, as torch refuses a second ``fully_shard`` (a policy of classes selects them:
    ``fully_shard`` makes a module an instance of a subclass of its class); every other
    module the policy selects gets one."""

    def setup_module(self, module: nn.Module) -> nn.Module:
        class _Never:  # no module is an instance: the user's units go unseen
            pass

        def around_them(root: nn.Module, policy: Any) -> list[nn.Module]:
            return [m for m in fsdp2_units_of(root, policy) if not isinstance(m, FSDPModule)]

        with (
            mock.patch.object(fsdp2_module, "FSDPModule", _Never),
            mock.patch.object(fsdp2_module, "units_of", around_them),
        ):
            result: nn.Module = super().setup_module(module)  # type: ignore[misc]
        return result


def rewraps_the_users_units(spec: StrategySpec) -> Any:
    """WRAP-2: a module the user applied ``fully_shard`` to is overridden by the policy."""
    return _as(_reference(spec), _RewrapsUsersUnits)


def ignores_the_mesh_tuple(spec: StrategySpec) -> Any:
    """CFG-3: a ``(replicate, shard)`` tuple is accepted and checked, then dropped: the mesh
    is 1-D over the world (no HSDP)."""
    strategy = _reference(spec)
    if isinstance(strategy._mesh_option, tuple):
        strategy._mesh_option = None
    return strategy


def ignores_module_wrap_policy(spec: StrategySpec) -> Any:
    """CFG-4: an ``auto_wrap_policy`` given as a ``ModuleWrapPolicy`` wraps nothing (only the
    root is a unit)."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    strategy = _reference(spec)
    if isinstance(spec.auto_wrap_policy, ModuleWrapPolicy):
        strategy.auto_wrap_policy = None
    return strategy
