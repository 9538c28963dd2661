"""One developer's FSDP2 strategy (the fsdp2 family), from torch's public API only.

``setup_module`` calls ``fully_shard`` on each module the wrap policy picks (inner ones
first) and on the root, on a 1-D mesh over the world or a ``(replicate, shard)`` mesh
(HSDP), with a ``MixedPrecisionPolicy`` from the precision. Checkpoints are
:mod:`independent.solo_fsdp2_ckpt`'s. Refused with ``Unsupported`` from the factory: fp16
precisions, activation checkpointing, FSDP1 policy objects and FSDP1-style callable
policies, parameter offload without an accelerator. It carries planted bugs (comments
``# PLANTED``; ``KNOWN_BUGS.md``), off when ``SOLO_FSDP2_CLEAN=1``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from harness import StrategySpec, Unsupported
from independent import plumbing, solo_fsdp2_ckpt, solo_fsdp2_load
from independent.plumbing import Collectives, Precision
from independent.solo_fsdp2_ckpt import PLANTED
from independent.solo_fsdp2_options import (
    global_grad_norm,
    materialize,
    mesh_option,
    offload_policy,
    reshard_option,
    wrap_policy,
)

__all__ = ["SoloFSDP2Strategy", "make_strategy"]

_OTHER_FAMILIES = (
    "sharding_strategy",
    "parallelize_fn",
    "data_parallel_size",
    "tensor_parallel_size",
    "save_distributed_checkpoint",
)


class SoloFSDP2Strategy(Collectives):
    """One rank's strategy: ``fully_shard`` by its own wrap policy."""

    def __init__(
        self,
        *,
        device: torch.device,
        precision: str,
        wrap: Callable[[nn.Module], bool] | None,
        reshard_after_forward: bool | int,
        offload: OffloadPolicy,
        mesh: tuple[int, int] | DeviceMesh | None,
        full: bool,
    ) -> None:
        self._device = device
        self._precision = Precision(precision, device)
        low = self._precision.autocast_dtype
        self.mp_policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low)
        self._wrap = wrap
        self._reshard = reshard_after_forward
        self._offload = offload
        self._mesh_option = mesh
        self._mesh: DeviceMesh | None = mesh if isinstance(mesh, DeviceMesh) else None
        self.full = full
        self._modules: list[nn.Module] = []
        self._sync_off: set[int] = set()

    # --- environment ------------------------------------------------------------------

    @property
    def root_device(self) -> torch.device:
        return self._device

    @property
    def precision(self) -> Precision:
        return self._precision

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        # every rank, HSDP replicas included, trains on a micro-batch of its own
        return {"num_replicas": dist.get_world_size(), "rank": dist.get_rank()}

    @property
    def checkpoint_io(self) -> Any:
        raise NotImplementedError("SoloFSDP2Strategy writes its own checkpoints; no checkpoint_io")

    @checkpoint_io.setter
    def checkpoint_io(self, value: Any) -> None:
        raise NotImplementedError("SoloFSDP2Strategy writes its own checkpoints; no checkpoint_io")

    def setup_environment(self) -> None:
        world = dist.get_world_size()
        if self._mesh is None:
            shape = self._mesh_option if isinstance(self._mesh_option, tuple) else (world,)
            names = ("replicate", "shard")[-len(shape) :]
            self._mesh = init_device_mesh(self._device.type, shape, mesh_dim_names=names)
        shard = self._mesh.size(self._mesh.ndim - 1)
        reshard = self._reshard
        if not isinstance(reshard, bool) and shard % reshard:
            raise ValueError(
                f"reshard_after_forward={reshard} does not divide the mesh's shard dimension "
                f"({shard} ranks); pass a divisor of {shard}, True or False."
            )

    def module_init_context(self, empty_init: bool | None = None) -> Any:
        stack = contextlib.ExitStack()
        stack.enter_context(self._precision.init_context())
        if empty_init:
            stack.enter_context(torch.device("meta"))
        return stack

    def setup_module(self, module: nn.Module) -> nn.Module:
        if self._mesh is None:
            raise RuntimeError("call setup_environment() before setup_module().")
        if any(isinstance(m, FSDP1) for m in module.modules()):
            raise TypeError(
                "the module holds FullyShardedDataParallel (FSDP1) units; pass a plain one."
            )
        stats = [m for m in module.modules() if getattr(m, "running_mean", None) is not None]
        if stats and self._precision.autocast_dtype is not None:
            raise Unsupported(  # bf16 weights would meet the float32 running statistics
                f"running statistics ({type(stats[0]).__name__}) under "
                f"{self._precision.name} are not implemented"
            )
        if any(t.is_meta for t in [*module.parameters(), *module.buffers()]):
            materialize(module, self._device)
        reshard = self._reshard
        if PLANTED:  # PLANTED (FSDP2-2): an int (reshard to n ranks) becomes True (all of them)
            reshard = bool(reshard)
        kwargs: dict[str, Any] = {
            "mesh": self._mesh,
            "reshard_after_forward": reshard,
            "mp_policy": self.mp_policy,
            "offload_policy": self._offload,
        }
        if any(isinstance(m, FSDPModule) for m in module.modules()):
            if self._wrap is not None:
                warnings.warn(
                    "the module already holds fully_shard units: auto_wrap_policy is ignored "
                    "and those units are kept as they are.",
                    UserWarning,
                    stacklevel=2,
                )
        elif self._wrap is not None:
            picked = [m for m in module.modules() if m is not module and self._wrap(m)]
            for unit in reversed(picked):  # inner units first
                fully_shard(unit, **kwargs)
        if not isinstance(module, FSDPModule):
            fully_shard(module, **kwargs)
        self._modules.append(module)
        return module

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        mine = {id(p) for m in self._modules for p in m.parameters()}
        if not any(id(p) in mine for g in optimizer.param_groups for p in g["params"]):
            raise ValueError(
                "the optimizer holds none of the set-up module's parameters; create it after "
                "setup_module, from the module it returned."
            )
        return optimizer

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer]
    ) -> tuple[nn.Module, list[Optimizer]]:
        if optimizers:
            raise ValueError(
                f"{len(optimizers)} optimizers passed: fully_shard replaces the parameters, so "
                "set up the module first and create the optimizers from it."
            )
        return self.setup_module(module), []

    def teardown(self) -> None:
        self._modules.clear()
        self._sync_off.clear()
        if not isinstance(self._mesh_option, DeviceMesh):
            self._mesh = None

    # --- training ---------------------------------------------------------------------

    def backward(self, tensor: torch.Tensor, module: nn.Module | None) -> None:
        tensor.backward()

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        return optimizer.step()

    def _root(self, module: nn.Module, what: str) -> nn.Module:
        if not isinstance(module, FSDPModule) or not any(module is m for m in self._modules):
            raise TypeError(
                f"{what} needs the root module setup_module returned, not {type(module).__name__}."
            )
        return module

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> Iterator[None]:
        if not enabled:
            yield
            return
        root = self._root(module, "no_backward_sync(enabled=True)")
        units = [m for m in root.modules() if isinstance(m, FSDPModule)]
        before = {id(u) for u in units if id(u) in self._sync_off}
        for unit in units:
            unit.set_requires_gradient_sync(False, recurse=False)
            self._sync_off.add(id(unit))
        try:
            yield
        finally:
            for unit in units:
                if id(unit) not in before:
                    unit.set_requires_gradient_sync(True, recurse=False)
                    self._sync_off.discard(id(unit))

    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> torch.Tensor:
        root = self._root(module, "clip_gradients_norm")
        order = float(norm_type)
        if math.isnan(order) or order <= 0:
            raise ValueError(
                f"norm_type={norm_type!r} is not a norm; use a positive number or inf."
            )
        grads = [p.grad for p in root.parameters() if p.grad is not None]
        replicas = self._mesh.size(0) if self._mesh is not None and self._mesh.ndim == 2 else 1
        total = global_grad_norm(grads, order, replicas, self._device)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(
                f"the total gradient norm of order {order} is {total.item()}; pass "
                "error_if_nonfinite=False to clip all the same."
            )
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        with torch.no_grad():
            for grad in grads:
                local = grad.to_local() if isinstance(grad, DTensor) else grad
                local.mul_(coef.to(local.dtype))
        return total

    # --- checkpoints --------------------------------------------------------------------

    def save_checkpoint(
        self,
        path: str,
        state: dict[str, Any],
        storage_options: Any = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"storage_options={storage_options!r} is not supported; pass None.")
        path = self.broadcast(os.fspath(path))
        key, optimizers, rest = plumbing.split_state(state, self._is_mine)
        if key is None:
            raise ValueError("could not find the set-up module in state; pass it as a value.")
        if self.full:
            solo_fsdp2_ckpt.save_full(path, key, state[key], optimizers, rest, filter or {})
        elif filter is not None:
            raise NotImplementedError("filter= works with full checkpoints only; pass None.")
        else:
            solo_fsdp2_ckpt.save_sharded(path, key, state[key], optimizers, rest)

    def load_checkpoint(
        self,
        path: str,
        state: dict[str, Any] | nn.Module | Optimizer | None = None,
        strict: bool = True,
    ) -> dict[str, Any]:
        path = os.fspath(path)
        if isinstance(state, Optimizer):
            raise NotImplementedError("load an optimizer together with its module, in a dict.")
        if isinstance(state, nn.Module):
            if not os.path.isfile(path):
                raise ValueError(f"{path!r} is not a file holding the module's state dict.")
            saved = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
            solo_fsdp2_load.load_full_model(state, saved, strict)
            return {}
        if not state:
            raise ValueError("state is empty: pass the objects to restore.")
        key, optimizers, rest = plumbing.split_state(state, self._is_mine)
        if key is None:
            raise ValueError("could not find the set-up module in state; pass it as a value.")
        saved = solo_fsdp2_load.load(path, state, key, optimizers, strict)
        plumbing.restore_metadata(state, rest, saved, strict)
        return {k: v for k, v in saved.items() if k not in state}

    def _is_mine(self, module: nn.Module) -> bool:
        return any(module is m for m in self._modules)


def make_strategy(spec: StrategySpec) -> SoloFSDP2Strategy:
    """This rank's :class:`SoloFSDP2Strategy`, or ``Unsupported`` for what it does not do."""
    if spec.family != "fsdp2":
        raise Unsupported("SoloFSDP2Strategy applies fully_shard itself", "family", spec.family)
    defaults = {f.name: f.default for f in dataclasses.fields(StrategySpec)}
    for name in _OTHER_FAMILIES:
        if getattr(spec, name) != defaults[name]:
            raise ValueError(
                f"{name}={getattr(spec, name)!r} is not an option of an fsdp2 strategy; "
                f"leave it at its default ({defaults[name]!r})."
            )
    if spec.extra:
        raise ValueError(f"unknown options {sorted(spec.extra)}; SoloFSDP2Strategy takes none.")
    if spec.state_dict_type not in ("full", "sharded"):
        raise ValueError(f"state_dict_type={spec.state_dict_type!r}; use 'full' or 'sharded'.")
    wrap = wrap_policy(spec.auto_wrap_policy)
    if spec.activation_checkpointing_policy is not None:
        raise Unsupported(
            "activation checkpointing is not implemented",
            "activation_checkpointing_policy",
            spec.activation_checkpointing_policy,
        )
    return SoloFSDP2Strategy(
        device=spec.device,
        precision=spec.precision,
        wrap=wrap,
        reshard_after_forward=reshard_option(spec.reshard_after_forward),
        offload=offload_policy(spec.cpu_offload, spec.device),
        mesh=mesh_option(spec.device_mesh, spec.world_size),
        full=spec.state_dict_type == "full",
    )
