"""What both reference strategy families share (CONTRACT.md section 1, API-1..API-8).

:class:`ShardedStrategyBase` owns the process group handling, the rank's device, the
collectives, the precision plugin, the refusal of ``checkpoint_io`` and the delegation of
checkpoints to :mod:`reference_impl.checkpoint`. A family subclasses it and implements
``setup_module``, ``setup_optimizer``, ``clip_gradients_norm``, ``no_backward_sync`` and
``_full_checkpoint``; it may extend ``setup_environment``, ``teardown`` and
``distributed_sampler_kwargs``.
"""

from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.optim import Optimizer

from reference_impl.precision import Precision, resolve_precision

__all__ = ["DEFAULT_TIMEOUT", "ShardedStrategyBase"]

DEFAULT_TIMEOUT = timedelta(minutes=30)

_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,  # divided by the group size afterwards
    "avg": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}


class ShardedStrategyBase(abc.ABC):
    """Base of the reference strategies: environment, collectives, precision, checkpoints.

    Args:
        precision: a precision string (``"32-true"``, ``"16-true"``, ``"bf16-true"``,
            ``"16-mixed"``, ``"bf16-mixed"``) or a :class:`~reference_impl.precision.Precision`.
        process_group_backend: backend used when the strategy initializes the default process
            group itself (default: ``"nccl"`` with CUDA, else ``"gloo"``). Ignored, by design,
            when a default process group already exists: the strategy reuses it (API-1).
        timeout: timeout of a process group the strategy initializes.
        root_device: the rank's device; by default ``cuda:LOCAL_RANK`` when CUDA is available
            and the backend is NCCL, else ``cpu``. Harness factories pass the spec's device.
    """

    def __init__(
        self,
        *,
        precision: str | Precision | None = "32-true",
        process_group_backend: str | None = None,
        timeout: timedelta | None = DEFAULT_TIMEOUT,
        root_device: torch.device | str | None = None,
    ) -> None:
        self.precision: Precision = resolve_precision(precision)
        if timeout is not None and not isinstance(timeout, timedelta):
            raise TypeError(
                f"timeout={timeout!r} must be a datetime.timedelta, e.g. timedelta(minutes=5)."
            )
        self._process_group_backend = process_group_backend
        self._timeout = timeout or DEFAULT_TIMEOUT
        self._root_device = torch.device(root_device) if root_device is not None else None
        self._owns_process_group = False
        self._environment_ready = False

    # ------------------------------------------------------------------ environment
    def setup_environment(self) -> None:
        """Join the default process group (reusing one that exists) and bind the device.

        An already initialized default process group is reused and never re-initialized or
        destroyed (API-1, API-8). Otherwise one is initialized from the ``env://`` variables
        (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``).
        """
        if not dist.is_available():
            raise RuntimeError("torch.distributed is not available in this build of torch.")
        if not dist.is_initialized():
            dist.init_process_group(
                backend=self._default_backend(), init_method="env://", timeout=self._timeout
            )
            self._owns_process_group = True
        device = self.root_device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.precision.bind_device(device)
        self._environment_ready = True

    def _ensure_environment(self) -> None:
        """Run ``setup_environment`` if it has not run yet (for callers that skipped it)."""
        if not self._environment_ready:
            self.setup_environment()

    def _default_backend(self) -> str:
        if self._process_group_backend is not None:
            return self._process_group_backend
        return "nccl" if torch.cuda.is_available() else "gloo"

    @property
    def root_device(self) -> torch.device:
        """This rank's device (API-6)."""
        if self._root_device is not None:
            return self._root_device
        backend = dist.get_backend() if dist.is_initialized() else self._default_backend()
        if torch.cuda.is_available() and "nccl" in str(backend):
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")

    @property
    def global_rank(self) -> int:
        """This process's rank in the default process group (0 before it exists)."""
        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def world_size(self) -> int:
        """Size of the default process group (1 before it exists)."""
        return dist.get_world_size() if dist.is_initialized() else 1

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """``num_replicas``/``rank`` of the data-parallel dimension (the world here)."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    @property
    def checkpoint_io(self) -> Any:
        """Not supported: checkpoints go through ``save_checkpoint``/``load_checkpoint`` (API-7)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not use a checkpoint_io plugin; call "
            "save_checkpoint()/load_checkpoint() on the strategy instead."
        )

    @checkpoint_io.setter
    def checkpoint_io(self, value: Any) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} does not support setting checkpoint_io={value!r}; "
            "checkpoints are written by the strategy's save_checkpoint()."
        )

    # ------------------------------------------------------------------ modules
    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[None]:
        """Context to create the model in (API-3).

        Args:
            empty_init: ``True`` creates parameters on the meta device; ``setup_module`` then
                materializes them and calls each module's ``reset_parameters()`` once.
                ``False``/``None`` creates real, normally initialized parameters.
        """
        return self._module_init_context(bool(empty_init))

    @contextlib.contextmanager
    def _module_init_context(self, empty_init: bool) -> Generator[None, None, None]:
        with contextlib.ExitStack() as stack:
            if empty_init:
                stack.enter_context(torch.device("meta"))
            stack.enter_context(self.precision.module_init_context())
            yield

    @abc.abstractmethod
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Shard ``module`` and return the sharded module (API-2)."""

    @abc.abstractmethod
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Check ``optimizer`` steps the set-up module's parameters and return it (API-2)."""

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer]
    ) -> tuple[nn.Module, list[Optimizer]]:
        """Set up the module, then each optimizer; returns ``(module, [optimizers])``."""
        module = self.setup_module(module)
        return module, [self.setup_optimizer(opt) for opt in optimizers]

    # ------------------------------------------------------------------ training
    def backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        """Backward through the precision plugin (scaled under ``16-mixed``, API-4)."""
        self.precision.backward(tensor, module, *args, **kwargs)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """Step ``optimizer`` through the precision plugin (API-4)."""
        return self.precision.optimizer_step(optimizer, **kwargs)

    @abc.abstractmethod
    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Clip gradients to a global norm; return the norm (CLIP-1)."""

    @abc.abstractmethod
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        """Skip gradient reduction inside the block when ``enabled`` (SYNC-1)."""

    # ------------------------------------------------------------------ collectives
    def all_reduce(
        self, tensor: Any, group: Any | None = None, reduce_op: str | Any = "mean"
    ) -> Any:
        """Reduce ``tensor`` over ``group`` (the world by default) and return the result (API-5).

        Args:
            tensor: the tensor to reduce; any other object is returned unchanged.
            group: process group to reduce over.
            reduce_op: ``"mean"`` (sum divided by the group size), ``"sum"``, ``"max"``,
                ``"min"``, ``"product"``, or a ``torch.distributed.ReduceOp``.
        """
        if not isinstance(tensor, Tensor) or not dist.is_initialized():
            return tensor
        mean = False
        if isinstance(reduce_op, str):
            key = reduce_op.lower()
            if key not in _REDUCE_OPS:
                raise ValueError(
                    f"reduce_op={reduce_op!r} is not supported; "
                    f"use one of {', '.join(_REDUCE_OPS)}."
                )
            op, mean = _REDUCE_OPS[key], key in ("mean", "avg")
        else:
            op = reduce_op
        result = tensor.detach().clone()
        if mean and not (result.is_floating_point() or result.is_complex()):
            result = result.to(torch.get_default_dtype())
        moved = result.to(self.root_device)
        dist.all_reduce(moved, op=op, group=group)
        if mean:
            moved = moved / dist.get_world_size(group)
        return moved.to(tensor.device)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Return rank ``src``'s ``obj`` on every rank (any picklable object, API-5)."""
        if not dist.is_initialized():
            return obj
        box = [obj]
        device = self.root_device if self.root_device.type == "cuda" else None
        dist.broadcast_object_list(box, src=src, device=device)
        return box[0]

    def barrier(self, name: str | None = None) -> None:
        """Wait until every rank reaches this point (``name`` is informational)."""
        if not dist.is_initialized():
            return
        if self.root_device.type == "cuda" and dist.get_backend() == "nccl":
            dist.barrier(device_ids=[self.root_device.index])
        else:
            dist.barrier()

    # ------------------------------------------------------------------ checkpoints
    @property
    @abc.abstractmethod
    def _full_checkpoint(self) -> bool:
        """Whether ``save_checkpoint`` writes the full (single file) format."""

    def save_checkpoint(
        self,
        path: str | os.PathLike[str],
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        """Save ``state`` to ``path`` (CONTRACT.md CKPT-SAVE-*) in this strategy's format.

        Args:
            path: target file (full format) or directory (sharded format); rank 0's wins.
            state: one sharded module, optimizers, and metadata, by key.
            storage_options: not supported; anything but ``None`` raises ``TypeError``.
            filter: ``{key: fn(name, value) -> bool}`` selecting entries (full format only).
        """
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint(storage_options={storage_options!r}) "
                "is not supported: this strategy has no checkpoint_io plugin to pass it to; "
                "leave storage_options=None."
            )
        from reference_impl.checkpoint import save_checkpoint

        save_checkpoint(path, state, full=self._full_checkpoint, filter=filter)

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        state: dict[str, Any] | nn.Module | Optimizer | None = None,
        strict: bool = True,
    ) -> dict[str, Any]:
        """Load a full or sharded checkpoint into ``state``; return the metadata not requested.

        Args:
            path: a full checkpoint file or a sharded checkpoint directory.
            state: objects to restore in place (module, optimizers, metadata keys), or a bare
                module to load from a file holding its state dict.
            strict: raise on missing/unexpected keys (CKPT-STRICT-1/2).
        """
        from reference_impl.checkpoint import load_checkpoint

        return load_checkpoint(path, state, strict=strict)

    # ------------------------------------------------------------------ teardown
    def teardown(self) -> None:
        """Release what the strategy holds (API-8).

        A default process group the caller created is left intact; one the strategy
        initialized itself is destroyed.
        """
        self.precision.teardown()
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_process_group = False
        self._environment_ready = False
