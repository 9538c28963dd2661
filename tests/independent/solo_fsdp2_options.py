"""What :class:`independent.solo_fsdp2.SoloFSDP2Strategy` does without its own state: the
option checks of construction (each returns the option in the form the strategy uses or
raises an error naming the value, ``Unsupported`` for a valid value it does not implement),
meta-device materialization and the global gradient norm of clipping.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy
from torch.distributed.tensor import DTensor

from harness import Unsupported
from independent.solo_fsdp2_ckpt import PLANTED

__all__ = [
    "global_grad_norm",
    "materialize",
    "mesh_option",
    "offload_policy",
    "reshard_option",
    "wrap_policy",
]


def materialize(module: nn.Module, device: torch.device) -> None:
    """Allocate a meta-device module, tie again what was tied, and call each module's
    ``reset_parameters()`` once where it owns parameters or buffers."""
    slots: dict[int, list[tuple[nn.Module, str]]] = {}
    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None:
                slots.setdefault(id(param), []).append((sub, name))
    module.to_empty(device=device)  # gives every slot a tensor of its own
    for (owner, name), *aliases in (s for s in slots.values() if len(s) > 1):
        for sub, alias in aliases:
            setattr(sub, alias, getattr(owner, name))
    with torch.no_grad():
        for sub in module.modules():
            owns = any(True for _ in sub.parameters(recurse=False)) or any(
                True for _ in sub.buffers(recurse=False)
            )
            reset = getattr(sub, "reset_parameters", None)
            if owns and callable(reset):
                reset()
            elif owns:
                warnings.warn(
                    f"{type(sub).__name__} has no reset_parameters(); left uninitialized.",
                    stacklevel=3,
                )


def wrap_policy(value: Any) -> Callable[[nn.Module], bool] | None:
    if value is None:
        return None
    if isinstance(value, type):
        value = {value}
    if isinstance(value, (set, frozenset, list, tuple)):
        classes = tuple(value)
        if not all(isinstance(c, type) and issubclass(c, nn.Module) for c in classes):
            raise TypeError(
                f"auto_wrap_policy={value!r} holds something that is not an nn.Module class."
            )
        return lambda m: isinstance(m, classes)
    if type(value).__module__.startswith("torch.distributed.fsdp"):
        raise Unsupported("FSDP1 policy objects are not implemented", "auto_wrap_policy", value)
    if callable(value):
        try:
            inspect.signature(value).bind(nn.Module())
        except TypeError:
            raise Unsupported(
                "only fn(module) -> bool callables are implemented, not FSDP1-style policies",
                "auto_wrap_policy",
                value,
            ) from None
        except ValueError:
            pass
        return value
    raise TypeError(
        f"auto_wrap_policy={value!r} is not a wrap policy; pass a set of nn.Module classes or "
        "a callable fn(module) -> bool."
    )


def reshard_option(value: Any) -> bool | int:
    if isinstance(value, bool):
        return value
    if not isinstance(value, int):
        raise TypeError(f"reshard_after_forward={value!r} is not a bool or an int.")
    if value < 1:
        raise ValueError(f"reshard_after_forward={value} must be at least 1 (ranks to reshard to).")
    return value


def offload_policy(value: Any, device: torch.device) -> OffloadPolicy:
    if value is None or isinstance(value, bool):
        policy = CPUOffloadPolicy() if value else OffloadPolicy()
    elif isinstance(value, OffloadPolicy):
        policy = value
    else:
        raise TypeError(f"cpu_offload={value!r} is not a bool or an FSDP2 OffloadPolicy.")
    if isinstance(policy, CPUOffloadPolicy) and device.type == "cpu":
        raise Unsupported("parameter offload needs an accelerator", "cpu_offload", value)
    return policy


def mesh_option(value: Any, world: int) -> tuple[int, int] | DeviceMesh | None:
    if value is None:
        return None
    if isinstance(value, DeviceMesh):
        if value.ndim not in (1, 2):
            raise ValueError(f"device_mesh has {value.ndim} dimensions; pass a 1-D or 2-D mesh.")
        return value
    if not (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise TypeError(
            f"device_mesh={value!r} is not a (replicate, shard) tuple of positive ints."
        )
    if value[0] * value[1] != world:
        raise ValueError(
            f"device_mesh={value!r} covers {value[0] * value[1]} ranks, the world size is {world}."
        )
    return value


def global_grad_norm(
    grads: list[torch.Tensor], order: float, replicas: int, device: torch.device
) -> torch.Tensor:
    """The norm of the unsharded gradients from each rank's shards: one partial norm and
    one count of nans per rank cross the ranks (gloo's MAX would drop a nan); HSDP's
    ``replicas`` hold the same gradients and count once."""
    if PLANTED:  # PLANTED (COMM-2): gathers every gradient whole to take its norm
        whole = [g.full_tensor() if isinstance(g, DTensor) else g for g in grads]
        norms = [torch.linalg.vector_norm(g.float(), order) for g in whole]
        if not norms:
            return torch.zeros((), device=device)
        return torch.linalg.vector_norm(torch.stack(norms), order)
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    parts = torch.zeros(2, dtype=torch.float64, device=device)
    for piece in local:
        if piece.numel() == 0:
            continue
        piece = piece.detach().double().abs()
        parts[1] += piece.isnan().sum()
        parts[0] = (
            torch.maximum(parts[0], piece.max())
            if math.isinf(order)
            else (parts[0] + piece.pow(order).sum())
        )
    if math.isinf(order):
        dist.all_reduce(parts[:1], op=dist.ReduceOp.MAX)
        dist.all_reduce(parts[1:], op=dist.ReduceOp.SUM)
        total = parts[0]
    else:
        dist.all_reduce(parts, op=dist.ReduceOp.SUM)
        total = (parts[0] / replicas).pow(1.0 / order)
    if parts[1] > 0:
        total = torch.full_like(total, math.nan)
    return total.float()
