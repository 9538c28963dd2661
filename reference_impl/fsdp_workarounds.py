"""Workarounds for two FSDP1 (``FullyShardedDataParallel``) bugs of torch 2.13 with
``use_orig_params=True``, applied by :class:`reference_impl.fsdp.FSDPStrategy`.

Each function's docstring names the torch code at fault, the symptom and why the fix is
safe; the suites keep a regression scenario for each (``suites/lib/controller/regressions.py``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

__all__ = ["allow_low_precision_shared_grads", "reregister_frozen_views"]


def reregister_frozen_views(root: nn.Module) -> None:
    """Register the parameters of frozen, unsharded FSDP units again after a backward.

    [Note: frozen NO_SHARD units] With ``use_orig_params=True`` FSDP1 exposes a unit's
    original parameters as plain tensor views during forward and registers them as
    parameters again in its post-backward hook. That hook never fires for a unit whose
    parameters are all frozen, and for an unsharded unit (NO_SHARD) nothing else restores
    them: after one training step the frozen parameters vanish from ``named_parameters()``
    and the full state dict fails with "FSDP assumes <name> is in the state_dict" (torch
    2.13, measured). Switching such a handle back to its (unsharded) sharded views restores
    them; the views alias the same storage, so no value changes.
    """
    for unit in FSDP.fsdp_modules(root):
        handle = getattr(unit, "_handle", None)
        if (
            handle is not None
            and handle._use_orig_params
            and not handle.uses_sharded_strategy
            and not handle.flat_param.requires_grad
        ):
            handle._use_sharded_views()


def allow_low_precision_shared_grads(root: nn.Module) -> None:
    """Let shared (tied) parameters of FSDP units hold low-precision gradients.

    [Note: tied parameters and low-precision gradients] With ``use_orig_params=True`` and a
    ``MixedPrecision`` ``param_dtype``, a NO_SHARD unit keeps its accumulated gradient in the
    low dtype under ``no_sync()``. The next forward's post-forward reshard calls torch's
    ``FlatParamHandle._use_sharded_grad_views`` (``torch/distributed/fsdp/_flat_param.py``),
    which gives a unit's original parameters low-precision gradient views through ``.data``
    but assigns a *shared* parameter's gradient plainly (``param.grad = prim_param.grad``),
    so the second micro-batch fails with "attempting to assign a gradient with dtype
    BFloat16 to a tensor with grad_dtype Float" (torch 2.13, measured; same with float16,
    and with ``keep_low_precision_grads=True`` in every strategy, no_sync or not). Setting
    ``grad_dtype = None`` on those shared parameters lets the assignment through; the
    gradient values are unchanged, and once gradients are synchronized they are float32
    again (unless ``keep_low_precision_grads``), as for every other parameter.
    """
    for unit in FSDP.fsdp_modules(root):
        handle = getattr(unit, "_handle", None)
        if handle is None or not handle._use_orig_params:
            continue
        low_precision = handle._uses_param_mixed_precision or handle._keep_low_precision_grads
        for param in handle.flat_param._shared_params or ():
            if low_precision and param.grad_dtype is not None:
                param.grad_dtype = None
