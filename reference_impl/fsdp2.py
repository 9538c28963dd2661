"""The reference FSDP2 strategy: ``fully_shard`` on each unit its wrap policy picks, then the root.

:class:`FSDP2Strategy` is the ``fsdp2`` family of the contract: it shards the model itself
(unlike :class:`~reference_impl.model_parallel.ModelParallelStrategy`, which hands a mesh to
a user ``parallelize_fn``), on a 1-D mesh over the world or a 2-D ``(replicate, shard)``
mesh (HSDP), with its own mixed-precision policy (from the precision string), offload
policy and ``reshard_after_forward``. Gradient sync, clipping and meta-device
materialization are FSDP2's and DTensor's, shared with the model-parallel family
(:mod:`reference_impl.model_parallel_ops`); checkpoints are the shared
:mod:`reference_impl.checkpoint` (``torch.distributed.checkpoint`` for both formats).
"""

from __future__ import annotations

import contextlib
import warnings
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.optim import Optimizer
from typing_extensions import override

from reference_impl import model_parallel_ops as ops
from reference_impl.base import DEFAULT_TIMEOUT
from reference_impl.fsdp2_options import (
    check_reshard_size,
    resolve_mesh,
    resolve_offload,
    resolve_reshard_after_forward,
    resolve_wrap_policy,
    units_of,
)
from reference_impl.fsdp_options import (
    check_mesh_size,
    resolve_activation_checkpointing,
    resolve_state_dict_type,
)
from reference_impl.fully_shard_base import FullyShardStrategyBase
from reference_impl.policies import apply_activation_checkpointing, select_modules
from reference_impl.precision import Precision

__all__ = ["FSDP2_MESH_DIM_NAMES", "FSDP2Strategy"]

#: the dims of an HSDP mesh; a 1-D mesh has the last only
FSDP2_MESH_DIM_NAMES = ("replicate", "shard")


class FSDP2Strategy(FullyShardStrategyBase):
    """Shard a model with FSDP2 (``torch.distributed.fsdp.fully_shard``).

    What it shares with the model_parallel family (the mesh, the optimizer checks, clipping)
    is :class:`~reference_impl.fully_shard_base.FullyShardStrategyBase`'s.

    Args:
        precision: a precision string or plugin. The mixed modes become the units'
            ``MixedPrecisionPolicy`` (parameters and gradient reduction in the low dtype,
            outputs as computed); the true modes set the dtype modules are created in.
        auto_wrap_policy: the modules that get their own ``fully_shard`` before the root: a
            set of module classes, a ``ModuleWrapPolicy``/``CustomPolicy``, a callable
            ``fn(module) -> bool``, or an FSDP1-style ``fn(module, recurse,
            nonwrapped_numel)``; None: the root is the only unit.
        reshard_after_forward: ``True`` frees the unsharded parameters after forward,
            ``False`` keeps them until backward, an int reshards them over that many ranks
            (a divisor of the shard dimension).
        activation_checkpointing_policy: like ``auto_wrap_policy``; the modules checkpointed
            (wrapped after sharding, outermost only).
        activation_checkpointing: deprecated; a module class or list of classes.
        state_dict_type: ``"full"`` (one file from rank 0) or ``"sharded"`` (a directory).
        cpu_offload: ``True``/``False`` or an FSDP2 ``OffloadPolicy``; offload needs an
            accelerator and is refused with ``ValueError`` without one.
        device_mesh: None (one shard dimension over the world), ``(replicate, shard)`` for
            HSDP (built at ``setup_environment``), or a 1-D/2-D ``DeviceMesh``.
        process_group_backend: backend if the strategy initializes the process group.
        timeout: timeout if the strategy initializes the process group.
        root_device: the rank's device (default: see ``ShardedStrategyBase``).
    """

    _sharded_by = "fully_shard"

    def __init__(
        self,
        precision: str | Precision | None = "32-true",
        auto_wrap_policy: Any = None,
        reshard_after_forward: bool | int = True,
        activation_checkpointing_policy: Any = None,
        activation_checkpointing: Any = None,
        state_dict_type: str = "sharded",
        cpu_offload: bool | OffloadPolicy | None = None,
        device_mesh: tuple[int, int] | DeviceMesh | None = None,
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
        self.auto_wrap_policy = resolve_wrap_policy(auto_wrap_policy)
        self.reshard_after_forward = resolve_reshard_after_forward(reshard_after_forward)
        self.activation_checkpointing_policy = resolve_activation_checkpointing(
            activation_checkpointing, activation_checkpointing_policy
        )
        self.state_dict_type = resolve_state_dict_type(state_dict_type)
        self.offload_policy = resolve_offload(cpu_offload)
        world = dist.get_world_size() if dist.is_initialized() else None
        self._mesh_option = resolve_mesh(device_mesh, world)
        if isinstance(self._mesh_option, DeviceMesh):
            self._device_mesh = self._mesh_option

    # ------------------------------------------------------------------ environment
    @override
    def setup_environment(self) -> None:
        """Join the process group, then build the mesh: 1-D over the world, or the
        ``(replicate, shard)`` mesh of HSDP (CFG-3).

        Raises:
            ValueError: the mesh does not cover the world, or an int
                ``reshard_after_forward`` does not divide its shard dimension.
        """
        super().setup_environment()
        if self._device_mesh is None:
            device_type = self.root_device.type
            if isinstance(self._mesh_option, tuple):
                check_mesh_size(self._mesh_option, self.world_size)
                self._device_mesh = init_device_mesh(
                    device_type, self._mesh_option, mesh_dim_names=FSDP2_MESH_DIM_NAMES
                )
            else:
                self._device_mesh = init_device_mesh(
                    device_type, (self.world_size,), mesh_dim_names=FSDP2_MESH_DIM_NAMES[1:]
                )
        check_reshard_size(self.reshard_after_forward, self.device_mesh.size(-1))

    @property
    def mp_policy(self) -> MixedPrecisionPolicy:
        """The ``MixedPrecisionPolicy`` every unit gets: the low dtype for parameters in
        forward and for gradient reduction under a mixed precision, none under a true one."""
        return self.precision.mixed_precision_policy() or MixedPrecisionPolicy()

    @property
    @override
    def _full_checkpoint(self) -> bool:
        return self.state_dict_type == "full"

    # ------------------------------------------------------------------ modules
    @override
    def setup_module(self, module: nn.Module) -> nn.Module:
        """``fully_shard`` each unit of the wrap policy (inner ones first), then the root;
        materialize a meta-device model; checkpoint the policy's modules (API-2, API-3).

        A module that already holds FSDP2 units keeps them: the wrap policy is ignored with
        a warning and only the root is sharded (if it is not already).

        Raises:
            TypeError: ``module`` holds FSDP1 wrappers; a meta-device module that owns state
                has no ``reset_parameters``.
        """
        self._ensure_environment()
        self._refuse_fsdp1(module, "shards with FSDP2 (fully_shard). Pass the plain module.")
        checkpointed = (
            select_modules(module, self.activation_checkpointing_policy)
            if self.activation_checkpointing_policy is not None
            else []
        )
        self._cast_true_precision(module)
        kwargs: dict[str, Any] = {
            "mesh": self.device_mesh,
            "reshard_after_forward": self.reshard_after_forward,
            "mp_policy": self.mp_policy,
            "offload_policy": self.offload_policy,
        }
        if any(isinstance(m, FSDPModule) for m in module.modules()):
            if self.auto_wrap_policy is not None:
                warnings.warn(
                    "The module already contains fully_shard units, so auto_wrap_policy is "
                    "ignored and the existing units are kept.",
                    UserWarning,
                    stacklevel=2,
                )
        else:
            for unit in reversed(units_of(module, self.auto_wrap_policy)):
                fully_shard(unit, **kwargs)  # post-order: inner units first
        if not isinstance(module, FSDPModule):
            fully_shard(module, **kwargs)
        self._finish_setup(module)
        if checkpointed:
            apply_activation_checkpointing(module, checkpointed)
        return module

    # ------------------------------------------------------------------ training
    def _require_root(self, module: nn.Module, what: str) -> nn.Module:
        if not any(module is m for m in self._modules) or not isinstance(module, FSDPModule):
            raise TypeError(
                f"{what} needs the sharded root module returned by setup_module() (an FSDP2 "
                f"root), got {type(module).__name__}."
            )
        return module

    @override
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        """Turn off FSDP2 gradient reduction (reduce-scatter and, under HSDP, all-reduce) on
        every unit inside the block when ``enabled``; restore it exactly on exit (SYNC-1).

        Raises:
            TypeError: ``enabled`` and ``module`` is not a root set up by this strategy.
        """
        if not enabled:
            return contextlib.nullcontext()
        root = self._require_root(module, "no_backward_sync(enabled=True)")
        return ops.gradient_sync_disabled([mod for _, mod in ops.fsdp_modules(root)])

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

        The norm is that of the unsharded gradients (replicas of HSDP counted once), the same
        on every rank; under ``16-mixed`` the gradients are unscaled first.

        Raises:
            TypeError: ``module`` is not a root set up by this strategy.
            ValueError: ``norm_type`` is not a norm's order (0, negative, nan).
            RuntimeError: the norm is not finite and ``error_if_nonfinite`` is true.
        """
        root = self._require_root(module, "clip_gradients_norm")
        order = self._norm_order(norm_type)
        return self._clip_dtensor_grads(root, optimizer, max_norm, order, error_if_nonfinite)

    # ------------------------------------------------------------------ teardown
    @override
    def teardown(self) -> None:
        """Drop the set-up modules and a mesh the strategy built, then release the base's
        state (API-8); the caller's process group stays usable."""
        self._modules.clear()
        if not isinstance(self._mesh_option, DeviceMesh):
            self._device_mesh = None
        super().teardown()
