"""Workarounds for FSDP1 (``FullyShardedDataParallel``) bugs of torch 2.13 (two with
``use_orig_params=True``, one of auto wrapping under mixed precision), applied by
:class:`reference_impl.fsdp.FSDPStrategy`.

Each function's docstring names the torch code at fault, the symptom and why the fix is
safe; the suites keep a regression scenario for each (``suites/lib/controller/regressions.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import CustomPolicy

from harness import torch_compat

__all__ = [
    "allow_low_precision_shared_grads",
    "callable_policy_as_selection",
    "reregister_frozen_views",
]


def callable_policy_as_selection(
    root: nn.Module, policy: Callable[..., bool], select: Callable[[nn.Module, Any], list]
) -> CustomPolicy:
    """The modules a callable wrap policy picks, as a policy object that picks exactly them.

    [Note: callable policies under mixed precision] With a ``mixed_precision`` config FSDP1
    ORs a callable ``auto_wrap_policy`` with ``_wrap_module_cls_individually`` (added for
    BatchNorm by pytorch/pytorch#76642), whose answer to ``recurse=True`` is always True.
    The user's "do not recurse here" is lost: ``size_based_auto_wrap_policy`` keeps
    ``nn.MultiheadAttention`` a leaf (``FORCE_LEAF_MODULES``), yet FSDP1 then wraps its
    ``out_proj``, which MultiheadAttention never calls (pytorch/pytorch#78109): the unit is
    never unsharded (FULL_SHARD: "mat2 must be a matrix, got 1-D tensor"; bf16: a dtype
    mismatch) and under NO_SHARD its gradient is never all-reduced, so ranks diverge
    (measured, torch 2.13). Replaying the policy's own recursion (``select``, as FSDP1 does
    without mixed precision) and handing FSDP1 the result as a ``CustomPolicy`` keeps the
    units the policy picks (WRAP-1); FSDP1 still wraps its mixed-precision-ignored classes
    individually on that path, of which the reference's configs name none (see [Note:
    running statistics compute in the parameters' dtype] in ``reference_impl/precision.py``).

    Args:
        root: the unwrapped model.
        policy: a callable ``fn(module, recurse, nonwrapped_numel)`` policy.
        select: :func:`reference_impl.policies.select_modules`.
    """
    chosen = {id(m) for m in select(root, policy)}
    return CustomPolicy(lambda module: id(module) in chosen)


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
        handle = torch_compat.fsdp1_handle(unit)
        if (
            handle is not None
            and torch_compat.fsdp1_uses_orig_params(handle)
            and not handle.uses_sharded_strategy
            and not handle.flat_param.requires_grad
        ):
            torch_compat.fsdp1_restore_sharded_views(handle)


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
        handle = torch_compat.fsdp1_handle(unit)
        if handle is None or not torch_compat.fsdp1_uses_orig_params(handle):
            continue
        low_precision = torch_compat.fsdp1_uses_low_precision(handle)
        for param in torch_compat.fsdp1_shared_params(handle):
            if low_precision and param.grad_dtype is not None:
                param.grad_dtype = None
