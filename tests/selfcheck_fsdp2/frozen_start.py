"""Planted bugs of an FSDP2 unit frozen at the model's first forward and unfrozen later
(PREC-2): FSDP2 resolves a unit's mixed-precision dtypes at the first forward from the
parameters that train then, and the reference resolves them again before a backward once
the unit trains (``reference_impl/fsdp2_dtypes.py``). Each factory gets that wrong one way;
``test_frozen_start_bugs.py`` shows the frozen-start check failing on PREC-2.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule

from harness.contract import StrategySpec
from selfcheck_fsdp2.broken import _as, _reference

__all__ = ["keeps_frozen_start_dtypes", "reduces_unfrozen_unit_in_float32"]


def _unchanged(module: nn.Module) -> None:
    del module


class _KeepsFrozenStartDtypes:
    """torch's own behaviour up to 2.13: the unit keeps no dtypes, for good."""

    def backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        with mock.patch("reference_impl.precision.resolve_unit_dtypes", _unchanged):
            super().backward(tensor, module, *args, **kwargs)  # type: ignore[misc]


def _float32(module: nn.Module) -> None:
    """Resolve unresolved units to float32 (the stored dtype) instead of the policy's."""
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            group = sub._get_fsdp_state()._fsdp_param_group
            if group is not None and getattr(group, "_orig_dtype", "unset") is None:
                group._orig_dtype = group._reduce_dtype = torch.float32


class _ReducesUnfrozenUnitInFloat32:
    """Resolves an unfrozen unit's dtypes to float32: training runs, the reduction is not
    in the precision's low dtype."""

    def backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        with mock.patch("reference_impl.precision.resolve_unit_dtypes", _float32):
            super().backward(tensor, module, *args, **kwargs)  # type: ignore[misc]


def keeps_frozen_start_dtypes(spec: StrategySpec) -> Any:
    """PREC-2: a unit frozen at the first forward keeps no mixed-precision dtypes."""
    return _as(_reference(spec), _KeepsFrozenStartDtypes)


def reduces_unfrozen_unit_in_float32(spec: StrategySpec) -> Any:
    """PREC-2: a unit frozen at the first forward reduces in float32 once unfrozen."""
    return _as(_reference(spec), _ReducesUnfrozenUnitInFloat32)
