"""The reference FSDP1 strategy: ``FullyShardedDataParallel`` behind the strategy API.

Runs on CPU (gloo) and CUDA (NCCL). See CONTRACT.md sections 1-4 for the behaviour each method
guarantees; the notes below explain the choices that torch does not make for us.

[Note: FSDP1 on CPU] FSDP1 refuses to run without an accelerator unless ``device_id`` is
given, so the strategy always passes the root device (``cpu`` included).

Clipping computes the global norm itself, checks it, and only then scales (CLIP-1; see the
note in :mod:`reference_impl.fsdp_clip`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.optim import Optimizer
from typing_extensions import override

from harness import torch_compat
from reference_impl.base import DEFAULT_TIMEOUT, ShardedStrategyBase
from reference_impl.fsdp_clip import fsdp_grad_norm
from reference_impl.fsdp_options import (
    HYBRID_STRATEGIES,
    check_mesh_size,
    resolve_activation_checkpointing,
    resolve_cpu_offload,
    resolve_device_mesh,
    resolve_fsdp_kwargs,
    resolve_sharding_strategy,
    resolve_state_dict_type,
)
from reference_impl.fsdp_workarounds import (
    allow_low_precision_shared_grads,
    callable_policy_as_selection,
    reregister_frozen_views,
)
from reference_impl.meta_init import MetaMaterializer, has_meta_tensors
from reference_impl.policies import (
    apply_activation_checkpointing,
    normalize_policy,
    select_modules,
)
from reference_impl.precision import Precision

__all__ = ["FSDPStrategy"]


@contextlib.contextmanager
def _no_shard_accepted(strategy: ShardingStrategy) -> Iterator[None]:
    """Silence torch's ``NO_SHARD`` deprecation while wrapping with it: the contract makes
    ``NO_SHARD`` a supported strategy (CFG-1) and hybrid on a shard size of 1 becomes it, so
    the warning would only tell the user what they asked for, once per wrapped unit."""
    with warnings.catch_warnings():
        if strategy == ShardingStrategy.NO_SHARD:
            warnings.filterwarnings(
                "ignore",
                message="The `NO_SHARD` sharding strategy is deprecated",
                category=FutureWarning,
            )
        yield


class FSDPStrategy(ShardedStrategyBase):
    """Shard a model with FSDP1 (``torch.distributed.fsdp.FullyShardedDataParallel``).

    Args:
        precision: precision mode string or plugin (see :mod:`reference_impl.precision`).
        cpu_offload: ``True``/``False`` or a ``CPUOffload``; parameter offload needs an
            accelerator and is refused with ``ValueError`` without one.
        mixed_precision: an FSDP ``MixedPrecision`` overriding the one the precision gives.
        auto_wrap_policy: set of module classes, ``ModuleWrapPolicy``/``CustomPolicy``, or a
            callable ``fn(module, recurse, nonwrapped_numel)``; selects the FSDP units.
        activation_checkpointing: deprecated; a module class or list of classes.
        activation_checkpointing_policy: like ``auto_wrap_policy``; the modules to checkpoint.
        sharding_strategy: ``FULL_SHARD``, ``SHARD_GRAD_OP``, ``NO_SHARD``, ``HYBRID_SHARD``,
            ``_HYBRID_SHARD_ZERO2`` (any case) or the ``ShardingStrategy`` enum.
        state_dict_type: ``"full"`` (one file from rank 0) or ``"sharded"`` (a directory).
        device_mesh: ``(replicate, shard)`` for hybrid sharding, built at
            ``setup_environment``, or a ready ``DeviceMesh``.
        process_group_backend: backend if the strategy initializes the process group.
        timeout: timeout if the strategy initializes the process group.
        root_device: the rank's device (default: see ``ShardedStrategyBase``).
        **kwargs: passed to ``FullyShardedDataParallel`` (``use_orig_params`` defaults to
            ``True``); unknown names raise ``TypeError``.
    """

    def __init__(
        self,
        precision: str | Precision | None = "32-true",
        cpu_offload: bool | CPUOffload | None = None,
        mixed_precision: MixedPrecision | None = None,
        auto_wrap_policy: Any = None,
        activation_checkpointing: Any = None,
        activation_checkpointing_policy: Any = None,
        sharding_strategy: str | ShardingStrategy = "FULL_SHARD",
        state_dict_type: str = "sharded",
        device_mesh: tuple[int, int] | DeviceMesh | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = DEFAULT_TIMEOUT,
        root_device: torch.device | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,
            root_device=root_device,
        )
        self.sharding_strategy = resolve_sharding_strategy(sharding_strategy)
        self.cpu_offload = resolve_cpu_offload(cpu_offload)
        if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
            raise TypeError(
                f"mixed_precision={mixed_precision!r} must be a torch.distributed.fsdp."
                "MixedPrecision or None."
            )
        self.mixed_precision = mixed_precision
        self.auto_wrap_policy = normalize_policy("auto_wrap_policy", auto_wrap_policy)
        self.activation_checkpointing_policy = resolve_activation_checkpointing(
            activation_checkpointing, activation_checkpointing_policy
        )
        self.state_dict_type = resolve_state_dict_type(state_dict_type)
        self._fsdp_kwargs = resolve_fsdp_kwargs(kwargs)
        world = dist.get_world_size() if dist.is_initialized() else None
        self._mesh_option = resolve_device_mesh(device_mesh, self.sharding_strategy, world)
        self._check_hybrid_groups()
        self.device_mesh: DeviceMesh | None = (
            self._mesh_option if isinstance(self._mesh_option, DeviceMesh) else None
        )
        self._modules: list[FSDP] = []

    def _check_hybrid_groups(self) -> None:
        """CFG-2: hybrid sharding needs a way to form groups; one way only."""
        has_group = self._fsdp_kwargs.get("process_group") is not None
        if has_group and self._mesh_option is not None:
            raise ValueError(
                "process_group and device_mesh were both given; FSDP takes one or the other. "
                "Pass only device_mesh=(replicate, shard) or only process_group."
            )
        if self.sharding_strategy in HYBRID_STRATEGIES and not (
            has_group or self._mesh_option is not None or self.auto_wrap_policy is not None
        ):
            raise RuntimeError(
                f"sharding_strategy={self.sharding_strategy.name} needs an auto_wrap_policy, "
                "a process_group or a device_mesh=(replicate, shard); none was given."
            )

    # ------------------------------------------------------------------ environment
    @override
    def setup_environment(self) -> None:
        """Join the process group (reusing an existing one) and build the device mesh."""
        super().setup_environment()
        if self.cpu_offload.offload_params and self.root_device.type == "cpu":
            raise ValueError(
                "cpu_offload=True needs the model on an accelerator, but this rank's device "
                "is cpu; use cpu_offload=False."
            )
        if self.device_mesh is not None or self.sharding_strategy not in HYBRID_STRATEGIES:
            return
        if self._fsdp_kwargs.get("process_group") is not None:
            return
        shape = self._mesh_option if isinstance(self._mesh_option, tuple) else None
        if shape is None:  # hybrid with only a wrap policy: one replica per node
            shape = _default_hybrid_shape(self.world_size)
        check_mesh_size(shape, self.world_size)
        self.device_mesh = init_device_mesh(
            self.root_device.type, shape, mesh_dim_names=("replicate", "shard")
        )

    @property
    @override
    def _full_checkpoint(self) -> bool:
        return self.state_dict_type == "full"

    @property
    def mixed_precision_config(self) -> MixedPrecision | None:
        """The FSDP ``MixedPrecision`` in use: the explicit one, else the precision's."""
        return self.mixed_precision or self.precision.mixed_precision_config()

    # ------------------------------------------------------------------ modules
    @override
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Wrap ``module`` in FSDP (materializing meta tensors) and apply checkpointing.

        A module that already contains FSDP units is kept as it is: the auto-wrap policy is
        ignored with a warning and only the root is wrapped (if it is not FSDP already).
        """
        self._ensure_environment()
        already = any(isinstance(m, FSDP) for m in module.modules())
        stored = {_clean_name(n): b.dtype for n, b in module.named_buffers()}
        checkpointed = (
            select_modules(module, self.activation_checkpointing_policy)
            if self.activation_checkpointing_policy is not None
            else []
        )
        if already:
            if self.auto_wrap_policy is not None:
                warnings.warn(
                    "The module already contains FullyShardedDataParallel units, so "
                    "auto_wrap_policy is ignored and the existing wrapping is kept.",
                    UserWarning,
                    stacklevel=2,
                )
            wrapped = module if isinstance(module, FSDP) else self._wrap(module, policy=None)
            self._keep_buffer_dtypes(wrapped, stored)
        else:
            wrapped = self._wrap(module, policy=self.auto_wrap_policy)
            self._keep_buffer_dtypes(wrapped, stored)
        allow_low_precision_shared_grads(wrapped)
        self.precision.cast_running_stats(wrapped)  # BatchNorm under a low param_dtype
        if checkpointed:
            apply_activation_checkpointing(wrapped, checkpointed)
        wrapped.register_state_dict_pre_hook(lambda root, *_: reregister_frozen_views(root))
        self._modules.append(wrapped)
        return wrapped

    @override
    def backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        """Backward through the precision plugin, then repair frozen NO_SHARD units."""
        super().backward(tensor, module, *args, **kwargs)
        for root in self._modules:
            reregister_frozen_views(root)

    def _keep_buffer_dtypes(self, wrapped: FSDP, stored: dict[str, torch.dtype]) -> None:
        """PREC-4: state dicts hold buffers at their stored dtype, not the compute dtype.

        [Note: buffer dtypes] FSDP1 casts buffers to ``buffer_dtype`` for compute and casts
        them back in its state-dict hook, except for a unit that manages no parameters of
        its own (e.g. a root whose layers are all wrapped): there the low dtype leaks into
        the state dict. A post hook on the root restores the stored dtypes.
        """
        config = self.mixed_precision_config
        if config is None or config.buffer_dtype is None or not stored:
            return

        def restore(module: nn.Module, state_dict: dict, prefix: str, *_: Any) -> None:
            for name, dtype in stored.items():
                value = state_dict.get(prefix + name)
                if isinstance(value, Tensor) and value.is_floating_point() and value.dtype != dtype:
                    state_dict[prefix + name] = value.to(dtype)

        wrapped.register_state_dict_post_hook(restore)

    def _wrap(self, module: nn.Module, policy: Any) -> FSDP:
        kwargs = dict(self._fsdp_kwargs)
        if self.mixed_precision_config is not None and callable(policy):
            # see [Note: callable policies under mixed ...]
            if not isinstance(policy, torch_compat.WrapPolicyBase):
                policy = callable_policy_as_selection(module, policy, select_modules)
        materializer = None
        if has_meta_tensors(module) and kwargs.get("param_init_fn") is None:
            materializer = MetaMaterializer(module, self.root_device)
            kwargs["param_init_fn"] = materializer
        kwargs.setdefault("device_id", self.root_device)
        strategy = self._effective_sharding_strategy()
        if self.device_mesh is not None and strategy in HYBRID_STRATEGIES:
            kwargs["device_mesh"] = self.device_mesh
        with _no_shard_accepted(strategy):
            wrapped = FSDP(
                module,
                sharding_strategy=strategy,
                cpu_offload=self.cpu_offload,
                auto_wrap_policy=policy,
                mixed_precision=self.mixed_precision_config,
                **kwargs,
            )
        if materializer is not None:
            materializer.warn_missing_reset()
        return wrapped

    def _effective_sharding_strategy(self) -> ShardingStrategy:
        """The strategy handed to FSDP: hybrid on a shard dimension of 1 becomes NO_SHARD.

        [Note: hybrid with shard size 1] On a ``(replicate, 1)`` mesh torch's FSDP1 falls back
        to NO_SHARD *within the size-1 shard group* and then never all-reduces across the
        replicate dimension, so every rank trains on its own batch alone (measured with torch
        2.13: gathered parameters differ between ranks after one step). Shard size 1 means
        plain replication, which is exactly NO_SHARD over the whole world; say so and use it.
        """
        mesh = self.device_mesh
        if self.sharding_strategy in HYBRID_STRATEGIES and mesh is not None and mesh.ndim == 2:
            if mesh.size(1) == 1:
                warnings.warn(
                    f"sharding_strategy={self.sharding_strategy.name} on a device mesh with a "
                    f"shard dimension of 1 ({tuple(mesh.shape)}) is plain replication; using "
                    "NO_SHARD over the whole world (torch's FSDP would otherwise skip the "
                    "gradient all-reduce across replicas).",
                    UserWarning,
                    stacklevel=3,
                )
                return ShardingStrategy.NO_SHARD
        return self.sharding_strategy

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Check that ``optimizer`` steps parameters of a set-up module and return it."""
        owned = {id(p) for m in self._modules for p in m.parameters()}
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if not any(id(p) in owned for p in params):
            flat = "" if self._fsdp_kwargs["use_orig_params"] else " (use_orig_params=False)"
            raise ValueError(
                f"The optimizer {type(optimizer).__name__} references none of the parameters "
                f"of the module returned by setup_module{flat}. Create the optimizer after "
                "setup_module(), from the returned module's parameters, then call "
                "setup_optimizer()."
            )
        return optimizer

    @override
    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer]
    ) -> tuple[nn.Module, list[Optimizer]]:
        """Set up a module and optimizers created before it (needs ``use_orig_params=True``)."""
        if not self._fsdp_kwargs["use_orig_params"]:
            raise ValueError(
                "setup_module_and_optimizers() needs use_orig_params=True: with "
                "use_orig_params=False FSDP replaces the parameters, so an optimizer created "
                "before setup_module() cannot step them. Call setup_module(), create the "
                "optimizer from its parameters, then setup_optimizer()."
            )
        return super().setup_module_and_optimizers(module, optimizers)

    # ------------------------------------------------------------------ training
    def _require_root(self, module: nn.Module, what: str) -> FSDP:
        is_root = isinstance(module, FSDP) and (
            any(module is m for m in self._modules) or torch_compat.fsdp1_is_root(module) is True
        )
        if not is_root:
            raise TypeError(
                f"{what} needs the sharded root module returned by setup_module() (a "
                f"FullyShardedDataParallel root), got {type(module).__name__}."
            )
        return module  # type: ignore[return-value]

    @override
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        """Skip gradient reduction inside the block when ``enabled`` (FSDP's ``no_sync``).

        Sync is restored exactly on exit, also when the block raises. ``enabled=False`` is a
        no-op. ``TypeError`` if ``enabled`` and ``module`` is not a sharded root.
        """
        if not enabled:
            return contextlib.nullcontext()
        return self._require_root(module, "no_backward_sync(enabled=True)").no_sync()

    @override
    @torch.no_grad()
    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Clip gradients so that their global norm is at most ``max_norm``; return the norm.

        The norm is that of the unsharded gradients (replicated ones counted once) and is the
        same on every rank. Under ``16-mixed`` the gradients are unscaled first. A non-finite
        norm with ``error_if_nonfinite`` raises ``RuntimeError`` on every rank before any
        gradient is changed.
        """
        root = self._require_root(module, "clip_gradients_norm")
        norm_type = float(norm_type)
        if not (norm_type > 0):
            raise ValueError(f"norm_type={norm_type!r} must be positive (or math.inf).")
        self.precision.unscale_gradients(optimizer, root)
        grads, total = fsdp_grad_norm(root, norm_type, self.root_device)
        if error_if_nonfinite and not bool(torch.isfinite(total)):
            raise RuntimeError(
                f"The total norm of order {norm_type} of the gradients is non-finite "
                f"({total.item()}), so they cannot be clipped to max_norm={max_norm}; the "
                "gradients were left unchanged. Pass error_if_nonfinite=False to clip anyway."
            )
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(coef.to(device=grad.device, dtype=grad.dtype))
        return total

    # ------------------------------------------------------------------ teardown
    @override
    def teardown(self) -> None:
        """Drop the set-up modules and the mesh; leave a caller's process group intact."""
        self._modules.clear()
        if isinstance(self._mesh_option, tuple) or self._mesh_option is None:
            self.device_mesh = None
        super().teardown()


def _clean_name(name: str) -> str:
    """A parameter or buffer name without FSDP/checkpoint wrapper segments."""
    wrappers = {"_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
    return ".".join(part for part in name.split(".") if part not in wrappers)


def _default_hybrid_shape(world_size: int) -> tuple[int, int]:
    """``(nodes, processes per node)`` from ``LOCAL_WORLD_SIZE`` (one node if unknown)."""
    import os

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if local <= 0 or world_size % local:
        local = world_size
    return world_size // local, local
