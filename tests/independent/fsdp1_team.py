"""A team's own FSDP1 strategy (the fsdp family), from torch's public API only.

The module is wrapped in ``FullyShardedDataParallel`` with ``use_orig_params=True``. Full
checkpoints go through FSDP's own ``state_dict_type`` API (``FULL_STATE_DICT`` on every
rank, ``offload_to_cpu=False``, see [Note: no CPU offload of full state dicts]) and one file
rank 0 writes; sharded ones through ``torch.distributed.checkpoint``'s state-dict helpers and
a DCP directory plus ``meta.pt``. Not implemented, and refused from the factory: hybrid
sharding, CPU offload, activation checkpointing, ``use_orig_params=False``, fp16.

[Note: no CPU offload of full state dicts] On CPU ranks FSDP's ``offload_to_cpu=True``
moves tensors that already are on the CPU and fails; the full state dict stays where the
parameters are, and the file is written from there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    MixedPrecision,
    ShardingStrategy,
    StateDictType,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.optim import Optimizer

from harness import StrategySpec, Unsupported
from independent import plumbing
from independent.plumbing import Collectives, Precision

__all__ = ["FSDP1TeamStrategy", "make_strategy"]

_SHARDINGS = {s.name: s for s in ShardingStrategy}
_HYBRID = {"HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"}
_MP_FIELDS = (
    "parallelize_fn",
    "data_parallel_size",
    "tensor_parallel_size",
    "save_distributed_checkpoint",
)
_PREFIX = "_fsdp_wrapped_module."


def sharding_from(value: Any) -> ShardingStrategy:
    """torch's member for a sharding strategy given by name (any case) or member.

    Raises:
        ValueError: naming the value and listing the accepted names.
    """
    if isinstance(value, ShardingStrategy):
        return value
    name = str(value).upper() if isinstance(value, str) else None
    if name is None or name not in _SHARDINGS:
        raise ValueError(
            f"sharding_strategy={value!r} is not a sharding strategy; use one of "
            f"{', '.join(_SHARDINGS)}."
        )
    return _SHARDINGS[name]


def wrap_policy(policy: Any) -> Any:
    """FSDP's ``auto_wrap_policy`` for a set of classes, a policy object or a callable."""
    if isinstance(policy, (set, frozenset, list, tuple)):
        return ModuleWrapPolicy(set(policy))
    return policy


class FSDP1TeamStrategy(Collectives):
    """One rank's strategy: the whole module in ``FullyShardedDataParallel``."""

    def __init__(
        self,
        *,
        device: torch.device,
        precision: str = "32-true",
        sharding_strategy: ShardingStrategy = ShardingStrategy.FULL_SHARD,
        auto_wrap_policy: Any = None,
        state_dict_type: str = "sharded",
    ) -> None:
        self._device = device
        self._precision = Precision(precision, device)
        self.sharding = sharding_strategy
        self.auto_wrap_policy = wrap_policy(auto_wrap_policy)
        self.full = state_dict_type == "full"
        self._modules: list[nn.Module] = []

    # --- environment --------------------------------------------------------------------

    @property
    def root_device(self) -> torch.device:
        return self._device

    @property
    def precision(self) -> Precision:
        return self._precision

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": dist.get_world_size(), "rank": dist.get_rank()}

    @property
    def checkpoint_io(self) -> Any:
        raise NotImplementedError("FSDP1TeamStrategy writes its own checkpoints; no checkpoint_io")

    @checkpoint_io.setter
    def checkpoint_io(self, value: Any) -> None:
        raise NotImplementedError("FSDP1TeamStrategy writes its own checkpoints; no checkpoint_io")

    def setup_environment(self) -> None:
        if not dist.is_initialized():
            raise RuntimeError("FSDP1TeamStrategy runs in an initialized default process group.")

    def module_init_context(self, empty_init: bool | None = None) -> Any:
        stack = contextlib.ExitStack()
        stack.enter_context(self._precision.init_context())
        if empty_init:
            stack.enter_context(torch.device("meta"))
        return stack

    def setup_module(self, module: nn.Module) -> nn.Module:
        low = self._precision.autocast_dtype
        mixed = None if low is None else MixedPrecision(low, low, low)
        wrapped = FSDP(
            module,
            sharding_strategy=self.sharding,
            auto_wrap_policy=self.auto_wrap_policy,
            mixed_precision=mixed,
            device_id=self._device,
            use_orig_params=True,
        )
        self._modules.append(wrapped)
        return wrapped

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        mine = {id(p) for m in self._modules for p in m.parameters()}
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if not any(id(p) in mine for p in params):
            raise ValueError(
                "the optimizer holds none of the set-up module's parameters; create it from "
                "the module setup_module returned."
            )
        return optimizer

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer]
    ) -> tuple[nn.Module, list[Optimizer]]:
        names = {id(p): n for n, p in module.named_parameters()}
        wrapped = self.setup_module(module)
        now = {n.replace(_PREFIX, ""): p for n, p in wrapped.named_parameters()}
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["params"] = [now[names[id(p)]] for p in group["params"]]
            optimizer.state.clear()
        return wrapped, optimizers

    def teardown(self) -> None:
        self._modules.clear()

    # --- training -----------------------------------------------------------------------

    def backward(self, tensor: torch.Tensor, module: nn.Module | None) -> None:
        tensor.backward()

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        return optimizer.step()

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> Iterator[None]:
        if not enabled:
            yield
            return
        if not isinstance(module, FSDP):
            raise TypeError(f"no_backward_sync needs the set-up root module, not {module!r}")
        with module.no_sync():
            yield

    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> torch.Tensor:
        if not isinstance(module, FSDP):
            raise TypeError(f"clip_gradients_norm needs the set-up root module, not {module!r}")
        p = float(norm_type)
        if math.isnan(p) or p <= 0:
            raise ValueError(f"norm_type={norm_type} is not a norm; use a positive number or inf.")
        grads = [q.grad for q in module.parameters() if q.grad is not None]
        local = [g.detach().float().abs() for g in grads if g.numel()]
        replicated = self.sharding == ShardingStrategy.NO_SHARD
        if math.isinf(p):
            total = torch.stack([g.max() for g in local]).max() if local else torch.zeros(())
            total = total.to(self._device)
            if not replicated:
                dist.all_reduce(total, op=dist.ReduceOp.MAX)
        else:
            powered = sum((g.pow(p).sum() for g in local), torch.zeros((), device=self._device))
            if not replicated:
                dist.all_reduce(powered)
            total = powered.pow(1.0 / p)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(f"the total gradient norm of order {norm_type} is {total.item()}")
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        with torch.no_grad():
            for g in grads:
                g.mul_(coef.to(g.dtype))
        return total

    # --- checkpoints ----------------------------------------------------------------------

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
        if not self.full and filter is not None:
            raise NotImplementedError("filter= works with full checkpoints only.")
        if self.full and os.path.isdir(path) and not plumbing.is_sharded_checkpoint(path):
            raise IsADirectoryError(f"{path!r} is a directory that is not a checkpoint.")
        module = state[key]
        scratch = plumbing.scratch_path(path)
        error: BaseException | None = None
        try:
            if self.full:
                content = self._full_content(key, module, optimizers)
                content.update(plumbing.plain_metadata(rest))
                for name, keep in (filter or {}).items():
                    content[name] = {k: v for k, v in content[name].items() if keep(k, v)}
                if dist.get_rank() == 0:
                    torch.save(content, scratch)
            else:
                dcp.save(self._sharded_content(key, module, optimizers), checkpoint_id=scratch)
                if dist.get_rank() == 0:
                    torch.save(plumbing.plain_metadata(rest), os.path.join(scratch, "meta.pt"))
        except BaseException as exc:
            error = exc
        try:
            plumbing.agree(error, f"saving {path!r}")
            if dist.get_rank() == 0:
                try:
                    plumbing.place_atomically(scratch, path)
                except BaseException as exc:
                    error = exc
            plumbing.agree(error, f"saving {path!r}")
        finally:
            if dist.get_rank() == 0:
                plumbing.remove(scratch)

    def _full_content(
        self, key: str, module: nn.Module, optimizers: dict[str, Any]
    ) -> dict[str, Any]:
        # [Note: no CPU offload of full state dicts]
        model_config = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
        optim_config = FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False)
        full = StateDictType.FULL_STATE_DICT
        with FSDP.state_dict_type(module, full, model_config, optim_config):
            content: dict[str, Any] = {key: _cpu(module.state_dict())}
            for name, value in optimizers.items():
                listed = [value] if isinstance(value, Optimizer) else list(value)
                saved = [_cpu(FSDP.optim_state_dict(module, o)) for o in listed]
                content[name] = saved[0] if isinstance(value, Optimizer) else saved
        return content

    def _sharded_content(
        self, key: str, module: nn.Module, optimizers: dict[str, Any]
    ) -> dict[str, Any]:
        content: dict[str, Any] = {key: get_model_state_dict(module)}
        for name, value in optimizers.items():
            listed = [value] if isinstance(value, Optimizer) else list(value)
            saved = []
            for optimizer in listed:
                fresh = not optimizer.state
                osd = get_optimizer_state_dict(module, optimizer)
                if fresh:  # reading initialized the state: a never-stepped one has none
                    optimizer.state.clear()
                    osd["state"] = {}
                saved.append(osd)
            content[name] = saved[0] if isinstance(value, Optimizer) else saved
        return content

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
                raise ValueError(f"{path!r} is not a file of the module's state dict.")
            saved = torch.load(path, weights_only=True, map_location="cpu")
            self._load_full_model(state, saved, strict)
            return {}
        if not state:
            raise ValueError("state is empty: pass the objects to restore.")
        key, optimizers, rest = plumbing.split_state(state, self._is_mine)
        if key is None:
            raise ValueError("could not find the set-up module in state; pass it as a value.")
        module = state[key]
        if plumbing.is_sharded_checkpoint(path):
            saved = self._load_sharded(path, key, module, optimizers, strict)
        elif os.path.isfile(path):
            saved = torch.load(path, weights_only=True, map_location="cpu")
            self._load_full_model(module, saved[key], strict)
            for name, value in optimizers.items():
                if name in saved:
                    self._load_full_optimizers(module, name, value, saved[name])
                elif strict:
                    raise KeyError(f"the checkpoint holds no optimizer state under {name!r}")
        else:
            raise ValueError(f"{path!r} is neither a checkpoint file nor a sharded checkpoint.")
        plumbing.restore_metadata(state, rest, saved, strict)
        return {k: v for k, v in saved.items() if k not in state}

    def _load_full_model(self, module: nn.Module, saved: dict[str, Any], strict: bool) -> None:
        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
        with FSDP.state_dict_type(module, StateDictType.FULL_STATE_DICT, config):
            on_device = {k: v.to(self._device) for k, v in saved.items()}
            module.load_state_dict(on_device, strict=strict)

    def _load_full_optimizers(self, module: nn.Module, name: str, value: Any, saved: Any) -> None:
        listed = [value] if isinstance(value, Optimizer) else list(value)
        entries = [saved] if isinstance(value, Optimizer) else list(saved)
        if len(entries) != len(listed):
            raise RuntimeError(
                f"the checkpoint holds {len(entries)} optimizers under {name!r}, "
                f"state passes {len(listed)}."
            )
        full = StateDictType.FULL_STATE_DICT
        config = FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False)
        for optimizer, osd in zip(listed, entries, strict=True):
            osd = self._named(module, optimizer, osd)
            with FSDP.state_dict_type(module, full, optim_state_dict_config=config):
                flat = FSDP.optim_state_dict_to_load(module, optimizer, osd)
            optimizer.load_state_dict(flat)

    def _named(self, module: nn.Module, optimizer: Optimizer, osd: dict[str, Any]) -> Any:
        """Integer-keyed optimizer state (a plain optimizer's) keyed by parameter names."""
        if not osd["state"] or not all(isinstance(k, int) for k in osd["state"]):
            return osd
        names = {id(p): n.replace(_PREFIX, "") for n, p in module.named_parameters()}
        order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
        state = {order[i]: v for i, v in osd["state"].items()}
        groups = [{**g, "params": [order[i] for i in g["params"]]} for g in osd["param_groups"]]
        return {"state": state, "param_groups": groups}

    def _load_sharded(
        self,
        path: str,
        key: str,
        module: nn.Module,
        optimizers: dict[str, Any],
        strict: bool,
    ) -> dict[str, Any]:
        stored = set(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)
        model = get_model_state_dict(module)
        on_disk = {s[len(key) + 1 :] for s in stored if s.startswith(f"{key}.")}
        missing = sorted(set(model) - on_disk)
        unexpected = sorted(on_disk - set(model))
        if strict and (missing or unexpected):
            raise KeyError(
                f"missing model keys {missing}, unexpected {unexpected} in {path!r}; "
                "pass strict=False"
            )
        target: dict[str, Any] = {key: {k: v for k, v in model.items() if k not in missing}}
        empty: list[Optimizer] = []
        for name, value in optimizers.items():
            listed = [value] if isinstance(value, Optimizer) else list(value)
            single = isinstance(value, Optimizer)
            prefixes = [f"{name}."] if single else [f"{name}.{i}." for i in range(len(listed))]
            count = len({s.split(".")[1] for s in stored if s.startswith(f"{name}.")})
            if not isinstance(value, Optimizer) and count != len(listed):
                raise RuntimeError(
                    f"the checkpoint holds {count} optimizers under {name!r}, "
                    f"state passes {len(listed)}."
                )
            osds = []
            for optimizer, prefix in zip(listed, prefixes, strict=True):
                osd = get_optimizer_state_dict(module, optimizer)
                if not any(s.startswith(f"{prefix}state.") for s in stored):
                    empty.append(optimizer)
                    osd = {"state": {}, "param_groups": osd["param_groups"]}
                osds.append(osd)
            target[name] = osds[0] if isinstance(value, Optimizer) else osds
        try:
            planner = dcp.DefaultLoadPlanner(allow_partial_load=True)
            dcp.load(target, checkpoint_id=path, planner=planner)
        except dcp.CheckpointException as exc:
            raise RuntimeError(f"reading the sharded checkpoint {path!r} failed: {exc}") from None
        set_model_state_dict(module, target[key], options=StateDictOptions(strict=False))
        for name, value in optimizers.items():
            listed = [value] if isinstance(value, Optimizer) else list(value)
            loaded = [target[name]] if isinstance(value, Optimizer) else target[name]
            for optimizer, osd in zip(listed, loaded, strict=True):
                if optimizer in empty:
                    optimizer.state.clear()
                    groups = zip(optimizer.param_groups, osd["param_groups"], strict=True)
                    for group, saved in groups:
                        group.update({k: v for k, v in saved.items() if k != "params"})
                else:
                    set_optimizer_state_dict(module, optimizer, osd)
        meta = torch.load(os.path.join(path, "meta.pt"), weights_only=True)
        return {**meta, **target}

    # --- helpers --------------------------------------------------------------------------

    def _is_mine(self, module: nn.Module) -> bool:
        return any(module is m for m in self._modules)


def _cpu(tree: Any) -> Any:
    """``tree`` with its tensors on the CPU (a file must load without the saving device)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: _cpu(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_cpu(v) for v in tree]
    return tree


def make_strategy(spec: StrategySpec) -> FSDP1TeamStrategy:
    """This rank's :class:`FSDP1TeamStrategy`, or ``Unsupported`` for what it does not do."""
    defaults = {f.name: f.default for f in dataclasses.fields(StrategySpec)}
    if spec.family != "fsdp":
        raise Unsupported("FSDP1TeamStrategy has no tensor parallelism", "family", spec.family)
    for name in _MP_FIELDS:
        if getattr(spec, name) != defaults[name]:
            raise ValueError(
                f"{name}={getattr(spec, name)!r} is a model_parallel option; "
                f"FSDP1TeamStrategy is an fsdp strategy: leave it at its default."
            )
    sharding = sharding_from(spec.sharding_strategy)  # an invalid name before any refusal
    extra = dict(spec.extra)
    use_orig_params = extra.pop("use_orig_params", True)
    if extra:
        raise ValueError(f"unknown options {sorted(extra)}; FSDP1TeamStrategy takes none.")
    if sharding.name in _HYBRID:
        raise Unsupported("hybrid sharding is not implemented", "sharding_strategy", sharding.name)
    if spec.device_mesh is not None:
        raise Unsupported("no device mesh without hybrid sharding", "device_mesh", spec.device_mesh)
    if spec.cpu_offload:
        raise Unsupported("CPU offload is not implemented", "cpu_offload", spec.cpu_offload)
    if spec.activation_checkpointing_policy is not None:
        raise Unsupported(
            "activation checkpointing is not implemented",
            "activation_checkpointing_policy",
            spec.activation_checkpointing_policy,
        )
    if use_orig_params is not True:
        raise Unsupported("only use_orig_params=True", "use_orig_params", use_orig_params)
    return FSDP1TeamStrategy(
        device=spec.device,
        precision=spec.precision,
        sharding_strategy=sharding,
        auto_wrap_policy=spec.auto_wrap_policy,
        state_dict_type=spec.state_dict_type,
    )
