"""The model-parallel reference strategy: a user ``parallelize_fn`` on a 2-D device mesh.

:class:`ModelParallelStrategy` builds a ``data_parallel`` x ``tensor_parallel`` device mesh
at ``setup_environment`` and hands it, with the model, to a user function that applies
FSDP2 (``fully_shard``) and/or tensor parallelism (DTensor). It then materializes a
meta-device model, checks that the mixed-precision policy matches the requested precision,
and offers gradient clipping and gradient-sync control over DTensor/FSDP2 modules
(CONTRACT.md sections 1-4 and 6: the API, CFG, SHARD, TRAIN, PREC and MP clauses).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from typing_extensions import override

from harness import torch_compat
from reference_impl import model_parallel_ops as ops
from reference_impl.base import DEFAULT_TIMEOUT
from reference_impl.fully_shard_base import FullyShardStrategyBase
from reference_impl.precision import Precision

__all__ = ["MESH_DIM_NAMES", "ModelParallelStrategy"]

MESH_DIM_NAMES = ("data_parallel", "tensor_parallel")

ParallelSize = int | Literal["auto"]
ParallelizeFn = Callable[[nn.Module, DeviceMesh], nn.Module]


class ModelParallelStrategy(FullyShardStrategyBase):
    """Data parallelism (FSDP2) x tensor parallelism applied by a user ``parallelize_fn``.

    What it shares with the fsdp2 family (the mesh, the optimizer checks, clipping) is
    :class:`~reference_impl.fully_shard_base.FullyShardStrategyBase`'s.

    Args:
        parallelize_fn: ``fn(module, device_mesh) -> module`` applying ``fully_shard`` on
            ``device_mesh["data_parallel"]`` and/or a tensor-parallel plan on
            ``device_mesh["tensor_parallel"]``; must return an ``nn.Module``.
        data_parallel_size: size of the ``data_parallel`` mesh dim; ``"auto"`` = the number
            of nodes (world size / ``LOCAL_WORLD_SIZE``; 1 on a single machine).
        tensor_parallel_size: size of the ``tensor_parallel`` mesh dim; ``"auto"`` = the
            number of processes per node (``LOCAL_WORLD_SIZE``, else the world size).
        save_distributed_checkpoint: ``True`` writes the sharded checkpoint format (a
            ``torch.distributed.checkpoint`` directory), ``False`` one full file (MP-3).
        precision: a precision string or plugin. The true modes set the dtype modules are
            created in; for the mixed modes the ``parallelize_fn`` applies the matching
            ``MixedPrecisionPolicy`` and ``setup_module`` checks it (PREC-2).
        process_group_backend: backend if the strategy initializes the default group itself.
        timeout: timeout of a process group the strategy initializes.
        root_device: the rank's device (default: see ``ShardedStrategyBase``).
    """

    _sharded_by = "parallelize_fn"

    def __init__(
        self,
        parallelize_fn: ParallelizeFn,
        data_parallel_size: ParallelSize = "auto",
        tensor_parallel_size: ParallelSize = "auto",
        save_distributed_checkpoint: bool = True,
        precision: str | Precision | None = "32-true",
        process_group_backend: str | None = None,
        timeout: timedelta | None = DEFAULT_TIMEOUT,
        root_device: torch.device | str | None = None,
    ) -> None:
        super().__init__(
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,
            root_device=root_device,
        )
        if not callable(parallelize_fn):
            raise TypeError(
                f"parallelize_fn={parallelize_fn!r} must be a callable "
                "fn(module, device_mesh) -> module that applies fully_shard and/or a "
                "tensor-parallel plan."
            )
        if not isinstance(save_distributed_checkpoint, bool):
            raise TypeError(
                f"save_distributed_checkpoint={save_distributed_checkpoint!r} must be a bool: "
                "True for the sharded format, False for one full file."
            )
        self._parallelize_fn = parallelize_fn
        self._data_parallel_size = _check_size("data_parallel_size", data_parallel_size)
        self._tensor_parallel_size = _check_size("tensor_parallel_size", tensor_parallel_size)
        self._save_distributed_checkpoint = save_distributed_checkpoint

    # ------------------------------------------------------------------ environment
    @override
    def setup_environment(self) -> None:
        """Join the default process group, then build the 2-D device mesh (CFG-8, MP-1).

        Raises:
            RuntimeError: ``data_parallel_size * tensor_parallel_size`` is not the world size.
        """
        super().setup_environment()
        if self._device_mesh is not None:
            return
        world_size = self.world_size
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        dp = self._data_parallel_size
        tp = self._tensor_parallel_size
        dp_size = max(world_size // local, 1) if dp == "auto" else dp
        tp_size = local if tp == "auto" else tp
        if dp_size * tp_size != world_size:
            raise RuntimeError(
                f"The sizes data_parallel_size={dp_size} and tensor_parallel_size={tp_size} "
                f"multiplied ({dp_size * tp_size}) must equal the world size ({world_size}); "
                "pass sizes whose product is the number of processes."
            )
        self._device_mesh = init_device_mesh(
            self.root_device.type, (dp_size, tp_size), mesh_dim_names=MESH_DIM_NAMES
        )

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """Size of the ``data_parallel`` mesh dim and this rank's coordinate on it (API-6)."""
        dp_mesh = self.device_mesh[MESH_DIM_NAMES[0]]
        return {"num_replicas": dp_mesh.size(), "rank": dp_mesh.get_local_rank()}

    @property
    @override
    def _full_checkpoint(self) -> bool:
        return not self._save_distributed_checkpoint

    # ------------------------------------------------------------------ modules
    @override
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Parallelize ``module`` with ``parallelize_fn`` and materialize it (API-2, API-3).

        Raises:
            TypeError: ``module`` contains FSDP1 wrappers, or ``parallelize_fn`` returned
                something other than an ``nn.Module`` (CFG-9); a meta-device module that
                owns state has no ``reset_parameters``.
            ValueError: the module's FSDP2 mixed-precision policy does not match the
                precision, or ``data_parallel_size > 1`` without any FSDP2 module.
        """
        self._ensure_environment()
        self._refuse_fsdp1(
            module,
            "works with FSDP2 (fully_shard) and DTensor only. Pass the plain module and apply "
            "fully_shard in parallelize_fn.",
        )
        mesh = self.device_mesh
        self._cast_true_precision(module)  # true modes: the strategy applies them
        result = self._parallelize_fn(module, mesh)
        if not isinstance(result, nn.Module):
            raise TypeError(
                f"parallelize_fn must return an nn.Module, but {_qualname(self._parallelize_fn)} "
                f"returned {type(result).__name__}; return the parallelized module."
            )
        self._check_data_parallel(result)
        self._check_precision_policy(result)
        self._finish_setup(result)
        return result

    def _check_data_parallel(self, module: nn.Module) -> None:
        dp_size = self.device_mesh[MESH_DIM_NAMES[0]].size()
        if dp_size > 1 and not ops.fsdp_modules(module):
            raise ValueError(
                f"data_parallel_size={dp_size} but parallelize_fn applied no FSDP2 "
                "fully_shard, so gradients would never be reduced over the data-parallel "
                'dimension. Call fully_shard(module, mesh=device_mesh["data_parallel"]) in '
                "parallelize_fn, or use data_parallel_size=1."
            )

    def _check_precision_policy(self, module: nn.Module) -> None:
        """Each FSDP2 module's ``param_dtype`` must be the one the precision needs (PREC-2)."""
        precision = self.precision
        expected = precision.compute_dtype if precision.is_mixed else None
        allowed = {expected} if expected is not None else {None, precision.param_dtype}
        for name, fsdp_module in ops.fsdp_modules(module):
            policy = torch_compat.fsdp2_mp_policy(fsdp_module)
            if policy.param_dtype not in allowed:
                fix = (
                    f"pass mp_policy=MixedPrecisionPolicy(param_dtype={expected}, "
                    f"reduce_dtype={expected}) to fully_shard in parallelize_fn "
                    f"(resolve_precision({precision.name!r}).mixed_precision_policy() builds it)"
                    if expected is not None
                    else "leave the mp_policy's param_dtype unset in parallelize_fn (a true "
                    "precision stores and computes in one dtype), or pick a mixed precision"
                )
                raise ValueError(
                    f"precision={precision.name!r} does not match fully_shard at "
                    f"{name or '<root>'!r}, whose mp_policy has "
                    f"param_dtype={policy.param_dtype}: {fix}."
                )

    # ------------------------------------------------------------------ training
    @override
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        """Turn off FSDP2 gradient reduction inside the block when ``enabled`` (MP-4, SYNC-1).

        Every FSDP2 module's sync flags are restored exactly on exit, also when the body
        raises. ``enabled=False`` is a no-op.

        Raises:
            TypeError: ``enabled`` is true and ``module`` contains no FSDP2 module.
        """
        if not enabled:
            return contextlib.nullcontext()
        fsdp_modules = [mod for _, mod in ops.fsdp_modules(module)]
        if not fsdp_modules:
            raise TypeError(
                f"no_backward_sync(module={type(module).__name__}, enabled=True) needs a module "
                "set up by ModelParallelStrategy with fully_shard applied; this one has no "
                "FSDP2 module, so there is no gradient sync to skip."
            )
        return ops.gradient_sync_disabled(fsdp_modules)

    @override
    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Scale gradients to a global norm of at most ``max_norm``; return the norm (CLIP-1).

        The norm is that of the unsharded gradients (DTensor shards combined, replicated
        gradients counted once) and is the same on every rank. Under ``16-mixed`` the
        gradients are unscaled first.

        Args:
            module: the module returned by ``setup_module``.
            optimizer: its optimizer (unscaled first under ``16-mixed``).
            max_norm: the largest global norm allowed.
            norm_type: the p of the p-norm (``float("inf")`` for the max norm).
            error_if_nonfinite: raise on a nan/inf norm, leaving gradients unclipped.

        Raises:
            TypeError: ``module`` has no DTensor parameters (not set up by this strategy).
            ValueError: ``norm_type`` is not a norm's order (0, negative, nan).
            RuntimeError: the norm is not finite and ``error_if_nonfinite`` is true.
        """
        order = self._norm_order(norm_type)  # checked first: see [Note: norm_type 0]
        if not any(isinstance(p, DTensor) for p in module.parameters()):
            raise TypeError(
                f"clip_gradients_norm(module={type(module).__name__}) needs the module returned "
                "by ModelParallelStrategy.setup_module (with DTensor parameters); this one has "
                "none."
            )
        return self._clip_dtensor_grads(module, optimizer, max_norm, order, error_if_nonfinite)

    # ------------------------------------------------------------------ teardown
    @override
    def teardown(self) -> None:
        """Drop the mesh and the set-up modules, then release the base's state (API-8).

        The mesh's process groups are left to ``torch.distributed`` (they go with the
        default group), so DTensors the caller still holds stay readable.
        """
        self._modules.clear()
        self._device_mesh = None
        super().teardown()


def _check_size(name: str, value: Any) -> ParallelSize:
    if value == "auto" and isinstance(value, str):
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f'{name}={value!r} must be "auto" or a positive int.')
    if value < 1:
        raise ValueError(f'{name}={value!r} must be "auto" or a positive int (at least 1).')
    return value


def _qualname(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__name__)
