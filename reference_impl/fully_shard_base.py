"""What the two FSDP2-based reference strategies share.

:class:`FullyShardStrategyBase` is the base of :class:`~reference_impl.fsdp2.FSDP2Strategy`
(which calls ``fully_shard`` itself, by its wrap policy) and of
:class:`~reference_impl.model_parallel.ModelParallelStrategy` (whose user ``parallelize_fn``
applies ``fully_shard`` and tensor parallelism). Both end with DTensor parameters, so they
share: the device mesh built at ``setup_environment``, the list of set-up modules, the refusal
of FSDP1 wrappers and of optimizers created before ``setup_module`` (API-2), what follows the
sharding (the true precisions' dtype, meta-device materialization, running statistics), and
clipping over DTensor gradients (CLIP-1). Each family keeps how it shards, which modules it
accepts as a root, and its gradient-sync switch.
"""

from __future__ import annotations

from datetime import timedelta

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
from torch.optim import Optimizer
from typing_extensions import override

from reference_impl import meta_init
from reference_impl import model_parallel_ops as ops
from reference_impl.base import DEFAULT_TIMEOUT, ShardedStrategyBase
from reference_impl.precision import Precision

__all__ = ["FullyShardStrategyBase"]


class FullyShardStrategyBase(ShardedStrategyBase):
    """Base of the strategies whose parameters ``fully_shard`` (FSDP2) makes DTensors.

    A subclass builds ``self._device_mesh`` in ``setup_environment``, shards in
    ``setup_module`` between :meth:`_refuse_fsdp1` / :meth:`_cast_true_precision` and
    :meth:`_finish_setup`, and clips with :meth:`_clip_dtensor_grads` once it has checked the
    module.

    Args:
        precision, process_group_backend, timeout, root_device: see
            :class:`~reference_impl.base.ShardedStrategyBase`.
    """

    #: what replaces the module's parameters with DTensors (named in the errors of API-2)
    _sharded_by = "setup_module"

    def __init__(
        self,
        *,
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
        self._device_mesh: DeviceMesh | None = None
        self._modules: list[nn.Module] = []

    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh the parameters are sharded over (built by ``setup_environment``)."""
        if self._device_mesh is None:
            raise RuntimeError(
                f"{type(self).__name__}.device_mesh is built by setup_environment(); "
                "call strategy.setup_environment() before reading it."
            )
        return self._device_mesh

    # ------------------------------------------------------------------ modules
    def _refuse_fsdp1(self, module: nn.Module, fix: str) -> None:
        """Refuse a module that holds FSDP1 wrappers (FSDP2 cannot shard them).

        Args:
            module: the module given to ``setup_module``.
            fix: what the user does instead, a sentence ending in a full stop.

        Raises:
            TypeError: ``module`` holds FSDP1 wrappers; the message names where.
        """
        wrapped = [name for name, mod in module.named_modules() if isinstance(mod, FSDP1)]
        if wrapped:
            raise TypeError(
                "The module contains FullyShardedDataParallel (FSDP1) wrappers at "
                f"{ops.describe_names(wrapped)}; {type(self).__name__} {fix}"
            )

    def _cast_true_precision(self, module: nn.Module) -> None:
        """Under ``bf16-true``/``16-true``, convert ``module`` to the low dtype before sharding
        (the mixed precisions are FSDP2's mixed-precision policy instead)."""
        if self.precision.param_dtype != torch.float32 and not self.precision.is_mixed:
            module.to(dtype=self.precision.param_dtype)

    def _finish_setup(self, module: nn.Module) -> None:
        """After sharding: materialize a meta-device module (API-3), cast BatchNorm running
        statistics under a low ``param_dtype``, and remember ``module`` as set up."""
        if meta_init.has_meta_tensors(module):
            ops.materialize(module, self.root_device)
        self.precision.cast_running_stats(module)
        self._modules.append(module)

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Return ``optimizer`` after checking it steps the set-up module's parameters (API-2).

        Raises:
            ValueError: no parameter of ``optimizer`` belongs to a module set up by this
                strategy (it was created before ``setup_module``).
        """
        owned = {id(p) for module in self._modules for p in module.parameters()}
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if not any(id(p) in owned for p in params):
            raise ValueError(
                f"The optimizer {type(optimizer).__name__} references none of the parameters "
                f"of a module set up by this strategy ({self._sharded_by} replaces them with "
                "sharded DTensor parameters). Create the optimizer after setup_module, from "
                "the returned module's parameters()."
            )
        return optimizer

    @override
    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer]
    ) -> tuple[nn.Module, list[Optimizer]]:
        """Set up ``module``; optimizers must be created afterwards (API-2).

        Raises:
            ValueError: ``optimizers`` is not empty. Sharding replaces every parameter with
                a DTensor, so an optimizer created before it would step the old tensors;
                nothing is set up in that case.
        """
        if optimizers:
            raise ValueError(
                f"{type(self).__name__}.setup_module_and_optimizers(module, "
                f"optimizers=[{len(optimizers)} optimizer(s)]): {self._sharded_by} replaces "
                "the module's parameters with DTensors, so these optimizers would not step "
                "them. Call setup_module(module) first, create the optimizers from the "
                "returned module's parameters(), then pass each to setup_optimizer()."
            )
        return self.setup_module(module), []

    # ------------------------------------------------------------------ training
    @staticmethod
    def _norm_order(norm_type: float) -> float:
        """``norm_type`` as a float, checked to be a norm's order (CLIP-1).

        Raises:
            ValueError: it is 0, negative or nan.
        """
        # [Note: norm_type 0] torch.nn.utils.get_total_norm takes norm_type=0 (a count of the
        # non-zero elements, not a norm) and the model_parallel family used to pass it on:
        # the "norm" it returned was the count of non-zero per-group norms, and clipping
        # scaled the gradients by max_norm over it. CLIP-1 refuses 0, negative orders and nan
        # with ValueError, as the fsdp family already did, before anything is unscaled or
        # scaled.
        order = float(norm_type)
        if not (order > 0):
            raise ValueError(f"norm_type={order!r} must be positive (or math.inf).")
        return order

    def _clip_dtensor_grads(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float,
        error_if_nonfinite: bool,
    ) -> Tensor:
        """Unscale (``16-mixed``), then scale the gradients of ``module``'s parameters to a
        global norm of at most ``max_norm``; return the norm (CLIP-1). The norm is that of the
        unsharded gradients (DTensor shards combined, replicated ones counted once), the same
        on every rank. ``module`` and ``norm_type`` are the caller's to check first.

        Raises:
            RuntimeError: the norm is not finite and ``error_if_nonfinite`` is true; the
                gradients are left unclipped.
        """
        self.precision.unscale_gradients(optimizer, module)
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        total = ops.grad_norm(grads, norm_type, self.root_device)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(
                f"The total norm of order {norm_type} of the gradients is {total.item()} (not "
                "finite); gradients were left unclipped. Pass error_if_nonfinite=False to clip "
                "anyway, or find the source of the nan/inf."
            )
        ops.scale_grads_(grads, max_norm, total)
        return total
