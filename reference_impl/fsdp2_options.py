"""Validation of :class:`~reference_impl.fsdp2.FSDP2Strategy` constructor options (CONTRACT.md
CFG-3, CFG-4, CFG-6, CFG-10 and the FSDP2-* clauses).

Each function checks one option eagerly and returns it in the form the strategy uses, or
raises an error that names the option, its value, the constraint and the fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

from harness.torch_compat import WrapPolicyBase
from reference_impl.fsdp_options import check_mesh_size, has_accelerator
from reference_impl.policies import normalize_policy, select_modules

__all__ = [
    "check_reshard_size",
    "resolve_mesh",
    "resolve_offload",
    "resolve_reshard_after_forward",
    "resolve_wrap_policy",
    "units_of",
]

#: What ``auto_wrap_policy`` becomes: None (the root is the only unit), a torch policy
#: object, a set of classes, or a callable of one module.
Fsdp2Policy = frozenset[type[nn.Module]] | WrapPolicyBase | Callable[..., bool] | None


def resolve_wrap_policy(value: Any) -> Fsdp2Policy:
    """Accept a set (list, tuple) of module classes, one class, a ``ModuleWrapPolicy`` /
    ``CustomPolicy``, a callable ``fn(module) -> bool`` or an FSDP1-style callable
    ``fn(module, recurse, nonwrapped_numel) -> bool`` (CFG-4).

    Raises:
        TypeError: anything else, naming the value.
    """
    if value is None or isinstance(value, WrapPolicyBase):
        return value
    if isinstance(value, type) or isinstance(value, (set, frozenset, list, tuple)):
        classes = {value} if isinstance(value, type) else set(value)
        normalize_policy("auto_wrap_policy", classes)  # raises TypeError naming a non-class
        return frozenset(classes)
    if callable(value):
        return value
    raise TypeError(
        f"auto_wrap_policy={value!r} is not a wrap policy: pass a set of nn.Module classes, a "
        "ModuleWrapPolicy/CustomPolicy, or a callable fn(module) -> bool."
    )


def _takes_one_module(fn: Callable[..., bool]) -> bool:
    try:
        inspect.signature(fn).bind(object())
    except TypeError:
        return False
    except ValueError:  # no signature: assume the FSDP2 form
        return True
    return True


def units_of(root: nn.Module, policy: Fsdp2Policy) -> list[nn.Module]:
    """The modules of ``root`` that ``policy`` makes units of their own (the root left out),
    in ``root.modules()`` order."""
    if policy is None:
        return []
    if isinstance(policy, frozenset):
        return [m for m in root.modules() if m is not root and isinstance(m, tuple(policy))]
    if isinstance(policy, WrapPolicyBase) or not _takes_one_module(policy):
        return select_modules(root, policy)
    return [m for m in root.modules() if m is not root and policy(m)]


def resolve_reshard_after_forward(value: Any) -> bool | int:
    """A bool, or an int of at least 1 (the size to reshard to after forward).

    Raises:
        TypeError: neither a bool nor an int.
        ValueError: an int below 1.
    """
    if isinstance(value, bool):
        return value
    if not isinstance(value, int):
        raise TypeError(
            f"reshard_after_forward={value!r} must be a bool or an int (the number of ranks "
            "to reshard the parameters over after forward)."
        )
    if value < 1:
        raise ValueError(
            f"reshard_after_forward={value!r} must be at least 1: the number of ranks to "
            "reshard over after forward, a divisor of the shard dimension's size."
        )
    return value


def check_reshard_size(value: bool | int, shard_size: int) -> None:
    """An int ``reshard_after_forward`` must divide the mesh's shard dimension.

    Raises:
        ValueError: it does not, naming both.
    """
    if isinstance(value, bool):
        return
    if shard_size % value:
        raise ValueError(
            f"reshard_after_forward={value} does not divide the shard dimension of the mesh "
            f"({shard_size} ranks); pass a divisor of {shard_size}, or True/False."
        )


def resolve_offload(value: bool | OffloadPolicy | None) -> OffloadPolicy:
    """A bool or an FSDP2 ``OffloadPolicy``; parameter offload needs an accelerator (CFG-6).

    Raises:
        TypeError: another kind of value.
        ValueError: offload asked on a machine without an accelerator.
    """
    if value is None or isinstance(value, bool):
        policy = CPUOffloadPolicy() if value else OffloadPolicy()
    elif isinstance(value, OffloadPolicy):
        policy = value
    else:
        raise TypeError(
            f"cpu_offload={value!r} must be a bool or a torch.distributed.fsdp.OffloadPolicy "
            "(CPUOffloadPolicy to offload)."
        )
    if isinstance(policy, CPUOffloadPolicy) and not has_accelerator():
        raise ValueError(
            f"cpu_offload={value!r} asks fully_shard to offload parameters to CPU, but this "
            "machine has no accelerator: the parameters already live on the CPU and the "
            "offload path copies to and from accelerator memory. Use cpu_offload=False here."
        )
    return policy


def resolve_mesh(
    value: tuple[int, int] | DeviceMesh | None, world_size: int | None
) -> tuple[int, int] | DeviceMesh | None:
    """``None`` (1-D over the world), ``(replicate, shard)`` (HSDP) or a 1-D/2-D
    ``DeviceMesh`` (CFG-3).

    Raises:
        TypeError: another kind of value.
        ValueError: a mesh of more than two dimensions, or a tuple whose product is not the
            world size (when known).
    """
    if value is None:
        return None
    if isinstance(value, DeviceMesh):
        if value.ndim not in (1, 2):
            raise ValueError(
                f"device_mesh has {value.ndim} dimensions; fully_shard takes a 1-D mesh "
                "(shard) or a 2-D one (replicate, shard) for HSDP."
            )
        return value
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise TypeError(
            f"device_mesh={value!r} must be a tuple (replicate, shard) of two positive ints "
            "(HSDP), a torch DeviceMesh, or None (one shard dimension over the world)."
        )
    check_mesh_size(value, world_size)
    return value
