"""A team's own FSDP2 strategy (the model_parallel family), from torch's public API only.

The module goes through the caller's ``parallelize_fn`` on a ``data_parallel`` x
``tensor_parallel`` mesh; checkpoints use ``torch.distributed.checkpoint.state_dict``'s
``get_/set_model_state_dict`` and ``get_/set_optimizer_state_dict``, saved full (one file
rank 0 writes) or sharded (a DCP directory plus ``meta.pt``). Not implemented, and refused
from the factory: fp16 precisions, the fsdp family, and fsdp-only options.
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
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from harness import StrategySpec, Unsupported
from independent import plumbing
from independent.plumbing import Collectives, Precision

__all__ = ["FSDP2TeamStrategy", "make_strategy"]

_FSDP_FIELDS = (
    "sharding_strategy",
    "auto_wrap_policy",
    "activation_checkpointing_policy",
    "state_dict_type",
    "cpu_offload",
    "device_mesh",
)
_MESH_DIMS = ("data_parallel", "tensor_parallel")
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FSDP2TeamStrategy(Collectives):
    """One rank's strategy: FSDP2 and tensor parallelism through ``parallelize_fn``."""

    def __init__(
        self,
        *,
        parallelize_fn: Callable[[nn.Module, DeviceMesh], nn.Module],
        device: torch.device,
        precision: str = "32-true",
        data_parallel_size: int | str = "auto",
        tensor_parallel_size: int | str = "auto",
        save_distributed_checkpoint: bool = True,
    ) -> None:
        self.parallelize_fn = parallelize_fn
        self._device = device
        self._precision = Precision(precision, device)
        self._sizes = (data_parallel_size, tensor_parallel_size)
        self.sharded = save_distributed_checkpoint
        self._mesh: DeviceMesh | None = None
        self._modules: list[nn.Module] = []
        self._sync_off: dict[int, bool] = {}

    # --- environment --------------------------------------------------------------------

    @property
    def root_device(self) -> torch.device:
        return self._device

    @property
    def precision(self) -> Precision:
        return self._precision

    @property
    def device_mesh(self) -> DeviceMesh:
        if self._mesh is None:
            raise RuntimeError("the device mesh is built by setup_environment(); call it first.")
        return self._mesh

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        dp = self.device_mesh["data_parallel"]
        return {"num_replicas": dp.size(), "rank": dp.get_local_rank()}

    @property
    def checkpoint_io(self) -> Any:
        raise NotImplementedError("FSDP2TeamStrategy writes its own checkpoints; no checkpoint_io")

    @checkpoint_io.setter
    def checkpoint_io(self, value: Any) -> None:
        raise NotImplementedError("FSDP2TeamStrategy writes its own checkpoints; no checkpoint_io")

    def setup_environment(self) -> None:
        world = dist.get_world_size()
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        dp_size, tp_size = self._sizes
        dp = world // per_node if dp_size == "auto" else int(dp_size)
        tp = per_node if tp_size == "auto" else int(tp_size)
        if dp * tp != world:
            raise RuntimeError(
                f"data_parallel_size={dp} times tensor_parallel_size={tp} must equal the "
                f"world size ({world})."
            )
        self._mesh = init_device_mesh(self._device.type, (dp, tp), mesh_dim_names=_MESH_DIMS)

    def module_init_context(self, empty_init: bool | None = None) -> Any:
        stack = contextlib.ExitStack()
        stack.enter_context(self._precision.init_context())
        if empty_init:
            stack.enter_context(torch.device("meta"))
        return stack

    def setup_module(self, module: nn.Module) -> nn.Module:
        if any(isinstance(m, FSDP1) for m in module.modules()):
            raise TypeError("the module holds FullyShardedDataParallel wrappers; pass a plain one.")
        if any(p.is_meta for p in module.parameters()):
            module.to_empty(device=self._device)
            with torch.no_grad():
                for sub in module.modules():
                    owns = list(sub.parameters(recurse=False)) + list(sub.buffers(recurse=False))
                    reset = getattr(sub, "reset_parameters", None)
                    if owns and callable(reset):
                        reset()
        else:
            module.to(self._device)
        out = self.parallelize_fn(module, self.device_mesh)
        if not isinstance(out, nn.Module):
            raise TypeError(f"parallelize_fn returned {type(out).__name__}, not an nn.Module.")
        self._modules.append(out)
        return out

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
        raise NotImplementedError(
            "set up the module first, then create the optimizers from its parameters."
        )

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
        if not isinstance(module, FSDPModule):
            raise TypeError(f"no_backward_sync needs the set-up root module, not {module!r}")
        before = self._sync_off.get(id(module), False)
        module.set_requires_gradient_sync(False)
        self._sync_off[id(module)] = True
        try:
            yield
        finally:
            module.set_requires_gradient_sync(not before)
            self._sync_off[id(module)] = before

    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> torch.Tensor:
        if not isinstance(module, FSDPModule):
            raise TypeError(f"clip_gradients_norm needs the set-up root module, not {module!r}")
        norm_type = float(norm_type)
        if math.isnan(norm_type) or norm_type <= 0:
            raise ValueError(f"norm_type={norm_type} is not a norm; use a positive number or inf.")
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        # every gradient whole on every rank: replicated parts counted once
        whole = [g.full_tensor() if isinstance(g, DTensor) else g for g in grads]
        norms = [torch.linalg.vector_norm(g.float(), norm_type) for g in whole]
        total = (
            torch.linalg.vector_norm(torch.stack(norms), norm_type)
            if norms
            else torch.zeros((), device=self._device)
        )
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
        module = state[key]
        if self.sharded:
            if filter is not None:
                raise NotImplementedError("filter= works with full checkpoints only.")
            self._save_sharded(path, key, module, optimizers, rest)
        else:
            self._save_full(path, key, module, optimizers, rest, filter or {})

    def _optim_state(self, module: nn.Module, optimizer: Optimizer, full: bool) -> Any:
        fresh = self._never_stepped(optimizer)
        options = _FULL if full else StateDictOptions()
        osd = get_optimizer_state_dict(module, optimizer, options=options)
        if fresh:  # reading initialized the state: a never-stepped optimizer has none
            optimizer.state.clear()
            osd["state"] = {}
        return osd

    def _gather(
        self, key: str, module: nn.Module, optimizers: dict[str, Any], full: bool
    ) -> dict[str, Any]:
        options = _FULL if full else StateDictOptions()
        content: dict[str, Any] = {key: get_model_state_dict(module, options=options)}
        for name, value in optimizers.items():
            if isinstance(value, Optimizer):
                content[name] = self._optim_state(module, value, full)
            else:
                content[name] = [self._optim_state(module, o, full) for o in value]
        return content

    def _save_full(
        self,
        path: str,
        key: str,
        module: nn.Module,
        optimizers: dict[str, Any],
        rest: dict[str, Any],
        filters: dict[str, Callable[[str, Any], bool]],
    ) -> None:
        if os.path.isdir(path) and not plumbing.is_sharded_checkpoint(path):
            raise IsADirectoryError(f"{path!r} is a directory that is not a checkpoint.")
        content = {**self._gather(key, module, optimizers, full=True)}
        content.update(plumbing.plain_metadata(rest))
        for name, keep in filters.items():
            content[name] = {k: v for k, v in content[name].items() if keep(k, v)}
        scratch = plumbing.scratch_path(path)
        error: BaseException | None = None
        if dist.get_rank() == 0:
            try:
                torch.save(content, scratch)
                plumbing.place_atomically(scratch, path)
            except BaseException as exc:
                plumbing.remove(scratch)
                error = exc
        plumbing.agree(error, f"saving {path!r}")

    def _save_sharded(
        self,
        path: str,
        key: str,
        module: nn.Module,
        optimizers: dict[str, Any],
        rest: dict[str, Any],
    ) -> None:
        content = self._gather(key, module, optimizers, full=False)
        scratch = plumbing.scratch_path(path)
        error: BaseException | None = None
        try:
            dcp.save(content, checkpoint_id=scratch)
            if dist.get_rank() == 0:
                torch.save(plumbing.plain_metadata(rest), os.path.join(scratch, "meta.pt"))
        except BaseException as exc:
            error = exc
        try:
            plumbing.agree(error, f"saving {path!r}")
            error = None
            if dist.get_rank() == 0:
                try:
                    plumbing.place_atomically(scratch, path)
                except BaseException as exc:
                    error = exc
            plumbing.agree(error, f"saving {path!r}")
        finally:
            if dist.get_rank() == 0:
                plumbing.remove(scratch)

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
            self._load_model(state, saved, strict)
            return {}
        if not state:
            raise ValueError("state is empty: pass the objects to restore.")
        key, optimizers, rest = plumbing.split_state(state, self._is_mine)
        if key is None:
            raise ValueError("could not find the set-up module in state; pass it as a value.")
        if plumbing.is_sharded_checkpoint(path):
            saved = self._read_sharded(path, key, state[key], optimizers, strict)
        elif os.path.isfile(path):
            saved = torch.load(path, weights_only=True, map_location="cpu")
        else:
            raise ValueError(f"{path!r} is neither a checkpoint file nor a sharded checkpoint.")
        module = state[key]
        self._load_model(module, saved[key], strict)
        for name, value in optimizers.items():
            if name not in saved:
                if strict:
                    raise KeyError(f"the checkpoint holds no optimizer state under {name!r}")
                continue
            self._load_optimizers(module, name, value, saved[name])
        plumbing.restore_metadata(state, rest, saved, strict)
        return {k: v for k, v in saved.items() if k not in state}

    def _load_model(self, module: nn.Module, saved: dict[str, Any], strict: bool) -> None:
        expected = set(get_model_state_dict(module).keys())
        missing = sorted(expected - set(saved))
        unexpected = sorted(set(saved) - expected)
        if strict and (missing or unexpected):
            raise KeyError(f"missing keys {missing}, unexpected keys {unexpected} in the model")
        if not saved:
            return
        if any(isinstance(v, DTensor) for v in saved.values()):  # sharded, loaded in place
            return
        present = {k: v for k, v in saved.items() if k in expected}
        if missing:  # torch asserts every key of a full state dict is there: keep the current
            present = {**get_model_state_dict(module, options=_FULL), **present}
        options = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(module, present, options=options)

    def _load_optimizers(self, module: nn.Module, name: str, value: Any, saved: Any) -> None:
        optimizers = [value] if isinstance(value, Optimizer) else list(value)
        entries = [saved] if isinstance(value, Optimizer) else list(saved)
        if len(entries) != len(optimizers):
            raise RuntimeError(
                f"the checkpoint holds {len(entries)} optimizers under {name!r}, "
                f"state passes {len(optimizers)}."
            )
        for optimizer, osd in zip(optimizers, entries, strict=True):
            _same_groups(optimizer, osd)
            if not osd.get("state"):
                optimizer.state.clear()
                self._set_groups(optimizer, osd)
                continue
            osd = self._named(module, optimizer, osd)
            values = [v for s in osd["state"].values() for v in s.values()]
            full = not any(isinstance(v, DTensor) for v in values)
            options = StateDictOptions(full_state_dict=full)
            set_optimizer_state_dict(module, optimizer, osd, options=options)

    def _named(self, module: nn.Module, optimizer: Optimizer, osd: dict[str, Any]) -> Any:
        """Integer-keyed optimizer state (a plain optimizer's) keyed by parameter names."""
        if not all(isinstance(k, int) for k in osd["state"]):
            return osd
        names = {id(p): n for n, p in module.named_parameters()}
        order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
        state = {order[i]: v for i, v in osd["state"].items()}
        groups = [{**g, "params": [order[i] for i in g["params"]]} for g in osd["param_groups"]]
        return {"state": state, "param_groups": groups}

    def _set_groups(self, optimizer: Optimizer, osd: dict[str, Any]) -> None:
        groups = osd.get("param_groups", [])
        if len(groups) != len(optimizer.param_groups):
            raise ValueError(
                f"the checkpoint has {len(groups)} parameter groups, the optimizer "
                f"{len(optimizer.param_groups)}."
            )
        for group, saved in zip(optimizer.param_groups, groups, strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})

    def _read_sharded(
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
        unexpected = sorted(on_disk - set(model))
        if strict and unexpected:
            raise KeyError(f"unexpected model keys {unexpected} in {path!r}; pass strict=False")
        target: dict[str, Any] = {key: {k: v for k, v in model.items() if k in on_disk}}
        for name, value in optimizers.items():
            if isinstance(value, Optimizer):
                target[name] = self._optim_target(module, value, f"{name}.", stored)
                continue
            count = len({s.split(".")[1] for s in stored if s.startswith(f"{name}.")})
            if count != len(value):
                raise RuntimeError(
                    f"the checkpoint holds {count} optimizers under {name!r}, "
                    f"state passes {len(value)}."
                )
            target[name] = [
                self._optim_target(module, o, f"{name}.{i}.", stored) for i, o in enumerate(value)
            ]
        planner = dcp.DefaultLoadPlanner(allow_partial_load=True)
        try:
            dcp.load(target, checkpoint_id=path, planner=planner)
        except dcp.CheckpointException as exc:
            raise RuntimeError(f"reading the sharded checkpoint {path!r} failed: {exc}") from None
        set_model_state_dict(module, target[key], options=StateDictOptions(strict=False))
        meta = torch.load(os.path.join(path, "meta.pt"), weights_only=True)
        return {**meta, **target}

    def _optim_target(
        self, module: nn.Module, optimizer: Optimizer, prefix: str, stored: set[str]
    ) -> dict[str, Any]:
        """What DCP reads one optimizer's state into; only its groups when it was saved
        before its first step."""
        head = f"{prefix}param_groups."
        groups = len({s[len(head) :].split(".")[0] for s in stored if s.startswith(head)})
        if groups != len(optimizer.param_groups):
            raise ValueError(
                f"the checkpoint has {groups} parameter groups, the optimizer "
                f"{len(optimizer.param_groups)}; build the optimizer as it was saved."
            )
        osd = get_optimizer_state_dict(module, optimizer)  # initializes the state
        if not any(s.startswith(f"{prefix}state.") for s in stored):
            optimizer.state.clear()
            return {"state": {}, "param_groups": osd["param_groups"]}
        return osd

    # --- helpers --------------------------------------------------------------------------

    def _is_mine(self, module: nn.Module) -> bool:
        return any(module is m for m in self._modules)

    def _never_stepped(self, optimizer: Optimizer) -> bool:
        flags: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(flags, not optimizer.state)
        return all(flags)


def _same_groups(optimizer: Optimizer, osd: dict[str, Any]) -> None:
    """Raise unless the saved parameter groups match the optimizer's in number and size.

    Raises:
        ValueError: naming the first group that differs.
    """
    saved = osd.get("param_groups", [])
    if len(saved) != len(optimizer.param_groups):
        raise ValueError(
            f"the checkpoint has {len(saved)} parameter groups, the optimizer "
            f"{len(optimizer.param_groups)}; build the optimizer as it was saved."
        )
    for i, (group, stored) in enumerate(zip(optimizer.param_groups, saved, strict=True)):
        if len(group["params"]) != len(stored["params"]):
            raise ValueError(
                f"parameter group {i} holds {len(group['params'])} parameters, the "
                f"checkpoint's {len(stored['params'])}; build the optimizer as it was saved."
            )


def make_strategy(spec: StrategySpec) -> FSDP2TeamStrategy:
    """This rank's :class:`FSDP2TeamStrategy`, or ``Unsupported`` for what it does not do."""
    if spec.family != "model_parallel":
        raise Unsupported("FSDP2TeamStrategy is an FSDP2 strategy", "family", spec.family)
    defaults = {f.name: f.default for f in dataclasses.fields(StrategySpec)}
    for name in _FSDP_FIELDS:
        if getattr(spec, name) != defaults[name]:
            raise ValueError(
                f"{name}={getattr(spec, name)!r} is an fsdp-family option; "
                f"FSDP2TeamStrategy takes parallelize_fn and the mesh sizes."
            )
    if spec.extra:
        raise ValueError(f"unknown options {sorted(spec.extra)}; FSDP2TeamStrategy takes none.")
    if spec.parallelize_fn is None:
        raise ValueError("parallelize_fn=None: FSDP2TeamStrategy needs one.")
    return FSDP2TeamStrategy(
        parallelize_fn=spec.parallelize_fn,
        device=spec.device,
        precision=spec.precision,
        data_parallel_size=spec.data_parallel_size,
        tensor_parallel_size=spec.tensor_parallel_size,
        save_distributed_checkpoint=spec.save_distributed_checkpoint,
    )
