"""FSDP2 units whose parameters were all frozen at the model's first forward.

[Note: a unit frozen at the first forward] FSDP2 resolves each unit's mixed-precision dtypes
(the dtype its gradients reduce in, and the dtype they are cast back to for the sharded
parameters) once, at the first forward, from the unit's parameters that require gradients
then. A unit whose parameters were all frozen at that moment (a fine-tuning recipe that
trains it later) gets none, for good: once unfrozen, its gradients reduce in the compute
dtype and are assigned to the float32 sharded parameters without the cast back, which
raises ("attempting to assign a gradient with dtype ... BFloat16 ...") or, with low-dtype
sharded parameters, reduces silently in the wrong dtype (pytorch#186998: torch 2.11.0 and
2.13.0 have it; 2.14.1 resolves such a unit from its floating parameters, so there this is a
no-op; the private names used here exist in all three). Before each backward the reference
resolves the dtypes of such units again from their parameters that train now (PREC-2,
CONTRACT.md); a unit resolved already is left as it is.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule

__all__ = ["resolve_unit_dtypes"]


def _unresolved(group: Any) -> bool:
    """Whether ``group`` (an FSDP2 parameter group) was initialized with no dtypes while
    a parameter of it now requires gradients."""
    return (
        hasattr(group, "_reduce_dtype")  # set at the first forward's lazy initialization
        and group._orig_dtype is None
        and any(p.sharded_param.requires_grad for p in group.fsdp_params)
    )


def resolve_unit_dtypes(module: nn.Module) -> None:
    """Resolve the mixed-precision dtypes of ``module``'s FSDP2 units that a frozen first
    forward left without them (see [Note: a unit frozen at the first forward]); a no-op for
    a module without FSDP2 units."""
    for sub in module.modules():
        if not isinstance(sub, FSDPModule):
            continue
        group = sub._get_fsdp_state()._fsdp_param_group
        if group is not None and _unresolved(group):
            group._init_mp_dtypes()
