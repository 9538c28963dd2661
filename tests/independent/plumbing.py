"""What both independent strategies need and torch does not give in one call: the precision
plugin, the collectives of the strategy surface, and checkpoint files written atomically.

Written from torch's public API only (``torch.autocast``, ``torch.distributed``); nothing of
``reference_impl`` or of the harness beyond :class:`harness.Unsupported`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from harness import Unsupported

__all__ = [
    "Collectives",
    "Precision",
    "agree",
    "is_sharded_checkpoint",
    "place_atomically",
    "scratch_path",
    "split_state",
]

_T = TypeVar("_T")

#: precision name -> (parameter dtype, autocast dtype or None)
_PRECISIONS: dict[str, tuple[torch.dtype, torch.dtype | None]] = {
    "32-true": (torch.float32, None),
    "bf16-true": (torch.bfloat16, None),
    "bf16-mixed": (torch.float32, torch.bfloat16),
}
_REFUSED = {"16-true", "16-mixed"}


class Precision:
    """The precision plugin: the forward runs under autocast for a mixed precision, and the
    parameters are created in the low dtype for a true one.

    Args:
        name: a precision name; ``16-true`` and ``16-mixed`` are not implemented.
        device: the rank's device (autocast's device type).
    """

    def __init__(self, name: Any, device: torch.device) -> None:
        if not isinstance(name, str):
            raise TypeError(f"precision={name!r} is not a string; use one of 32-true, bf16-mixed.")
        if name in _REFUSED:
            raise Unsupported("fp16 needs a gradient scaler, not implemented", "precision", name)
        if name not in _PRECISIONS:
            raise ValueError(
                f"precision={name!r} is not a precision; use one of "
                f"{', '.join([*_PRECISIONS, *sorted(_REFUSED)])}."
            )
        self.name = name
        self.device = device
        self.param_dtype, self.autocast_dtype = _PRECISIONS[name]

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast to the low dtype under a mixed precision, nothing otherwise."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def convert_input(self, data: Any) -> Any:
        """Floating inputs in the parameters' dtype under a true precision."""
        if isinstance(data, torch.Tensor) and data.is_floating_point():
            return data.to(self.param_dtype)
        return data

    @contextlib.contextmanager
    def init_context(self) -> Iterator[None]:
        """Modules created inside get parameters of the precision's dtype."""
        before = torch.get_default_dtype()
        torch.set_default_dtype(self.param_dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(before)


class Collectives:
    """``all_reduce``, ``broadcast`` and ``barrier`` over the default process group."""

    def all_reduce(self, tensor: _T, group: Any | None = None, reduce_op: str = "mean") -> _T:
        if not isinstance(tensor, torch.Tensor):
            return tensor
        if reduce_op not in ("mean", "sum"):
            raise ValueError(f"reduce_op={reduce_op!r} is not supported; use 'mean' or 'sum'.")
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        if reduce_op == "mean":
            tensor.div_(dist.get_world_size(group))
        return tensor

    def broadcast(self, obj: _T, src: int = 0) -> _T:
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self, name: str | None = None) -> None:
        dist.barrier()


def agree(error: BaseException | None, what: str) -> None:
    """Raise on every rank when ``error`` happened on any (a collective).

    Raises:
        RuntimeError: naming the first rank that failed and its error.
    """
    errors: list[str | None] = [None] * dist.get_world_size()
    text = None if error is None else f"{type(error).__name__}: {error}"
    dist.all_gather_object(errors, text)
    failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
    if not failed:
        return
    if error is not None:
        raise error
    rank, message = failed[0]
    raise RuntimeError(f"{what} failed on rank {rank}: {message}")


def scratch_path(path: str) -> str:
    """A fresh name beside ``path`` that rank 0 picks and every rank uses (a collective)."""
    box = [f"{path}.tmp-{uuid.uuid4().hex[:8]}"]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def is_sharded_checkpoint(path: str) -> bool:
    """Whether ``path`` is a directory ``torch.distributed.checkpoint`` wrote."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, ".metadata"))


def place_atomically(scratch: str, path: str) -> None:
    """Move the finished ``scratch`` (file or directory) to ``path``, replacing what is there;
    the old checkpoint is removed only once the new one is in place (rank 0 only)."""
    if os.path.isdir(path) or (os.path.isdir(scratch) and os.path.exists(path)):
        old = f"{path}.old-{uuid.uuid4().hex[:8]}"
        os.replace(path, old)
        os.replace(scratch, path)
        if os.path.isdir(old):
            shutil.rmtree(old)
        else:
            os.remove(old)
        return
    os.replace(scratch, path)


def remove(path: str) -> None:
    """Remove a file or directory if it exists."""
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


def split_state(
    state: Mapping[str, Any], is_module: Callable[[nn.Module], bool]
) -> tuple[str | None, dict[str, Any], dict[str, Any]]:
    """``state``'s module key, its optimizers (an optimizer or a list of them, by key) and
    the rest (metadata).

    Raises:
        ValueError: no set-up module in ``state`` ("could not find"), or several ("multiple").
    """
    modules = [k for k, v in state.items() if isinstance(v, nn.Module) and is_module(v)]
    if len(modules) > 1:
        raise ValueError(f"state holds multiple set-up modules ({', '.join(modules)}); pass one.")
    optimizers: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in state.items():
        if key in modules:
            continue
        if isinstance(value, Optimizer) or (
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(v, Optimizer) for v in value)
        ):
            optimizers[key] = value
        else:
            rest[key] = value
    return (modules[0] if modules else None), optimizers, rest


def plain_metadata(rest: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata as stored: an object with ``state_dict()`` is stored as its state dict."""
    return {key: (value.state_dict() if _stateful(value) else value) for key, value in rest.items()}


def restore_metadata(
    state: dict[str, Any], rest: Mapping[str, Any], saved: Mapping[str, Any], strict: bool
) -> None:
    """Put the saved metadata back into ``state`` in place.

    Raises:
        KeyError: with ``strict``, a requested key the checkpoint does not hold.
    """
    for key, value in rest.items():
        if key not in saved:
            if strict:
                raise KeyError(f"the checkpoint holds no entry {key!r}; pass strict=False")
            continue
        if _stateful(value):
            value.load_state_dict(saved[key])
        else:
            state[key] = saved[key]


def _stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )
