"""Reading and loading the state of several optimizers of one sharded model.

torch reads an FSDP1 optimizer's state per flat parameter and needs every trainable
parameter of a flat parameter to be stepped by that one optimizer. Trainers often split a
model's parameters over several optimizers (CKPT-TRAINER-1), and with FSDP1 those may share
a flat parameter. So for an FSDP1 model with several optimizers we read and load through
:class:`CombinedOptimizer`, one optimizer's face over all of them, and split the result by
parameter groups. Other families read each optimizer on its own. (torch's FSDP1 reader
still needs one state layout per flat parameter: two optimizers of different kinds, say
Adam and SGD with momentum, cannot split one FSDP1 unit; give each its own unit.)

[Note: optimizers that never stepped] torch initializes the state of an optimizer that
never stepped (a zero-learning-rate step) before reading it; when saving we undo that, so
saving never changes training and such an optimizer is saved with an empty ``state``, as
its own ``state_dict()`` would be.

[Note: trainable parameters without optimizer state] A parameter may train
(``requires_grad``) while no optimizer holds it yet (a recipe that builds its optimizer over
part of the model and adds the rest later with ``add_param_group``, TRAIN-4), or while its
newly added group has not stepped yet. torch's FSDP1 reader then raises ("... is not in the
optimizer state"): it needs every trainable parameter of a flat parameter in the state once
any has state. Such a parameter has no optimizer state to save, so while saving we mark it
frozen (torch then treats its part of the flat parameter as padding) and set it back
afterwards. The target that a sharded load reads into is different: there every parameter
of an optimizer that stepped first gets a state (as torch does for an optimizer that never
stepped; frozen ones too), so that the checkpoint's state for it is loaded; what the
checkpoint does not hold is dropped after the load (``finish_optimizer_load``).

[Note: gradients held at a load] torch initializes a never-stepped optimizer's state only
while none of its parameters holds a gradient (it would otherwise step with those
gradients); when one does, it reads the optimizer as stateless, so a sharded load reads the
checkpoint's optimizer state into an empty target and drops it (pytorch#140898: a recipe
that ran a forward and a backward before resuming). The target read for a load sets such an
optimizer's gradients aside while torch initializes its state, and puts them back after.

[Note: frozen parameters keep their state] torch's loader skips the saved state of a
frozen parameter (``requires_grad=False``), though its reader saves it. A parameter frozen
after it stepped keeps its optimizer state through a checkpoint (TRAIN-4): while loading,
the frozen parameters whose state the checkpoint holds are marked trainable, then frozen
again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.optim import Optimizer

from reference_impl.checkpoint.fsdp1_full import read_full_optimizer
from reference_impl.checkpoint.local_shards import holds_dtensors, shard_optimizer_state
from reference_impl.checkpoint.state import (
    clean_name,
    finish_optimizer_load,
    reads_fsdp1_natively,
    state_dict_options,
)

__all__ = ["CombinedOptimizer", "load_optimizer_states", "read_optimizer_states"]


class CombinedOptimizer(Optimizer):
    """Several optimizers seen as one: their parameter groups (the same dicts) and state.

    Used only to hand torch's FSDP1 state-dict helpers all the optimizers of a model at
    once. ``step()`` steps each part; :meth:`write_back` copies a loaded state to the parts.

    Args:
        parts: The optimizers, in order; their groups follow each other in that order.
    """

    def __init__(self, parts: Sequence[Optimizer]) -> None:
        self.parts = list(parts)
        groups = [group for part in self.parts for group in part.param_groups]
        super().__init__([dict(group) for group in groups], defaults={})
        self.param_groups = groups  # the parts' own dicts: hyper-parameter edits reach them
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the merged state from the parts' states.

        Once any part has state, every trainable parameter without state gets an empty
        one: torch's FSDP1 reader needs all trainable parameters of a flat parameter in the
        state (a part may be stateless, e.g. SGD without momentum). :func:`_split` drops
        the empty states again.
        """
        self.state.clear()
        for part in self.parts:
            self.state.update(part.state)
        if self.state:
            for group in self.param_groups:
                for param in group["params"]:
                    if param.requires_grad and param not in self.state:
                        self.state[param] = {}

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        """Step every part (torch does this once to initialize a never-stepped state)."""
        for part in self.parts:
            part.step()
        self.refresh()

    def write_back(self) -> None:
        """Give each part its share of the loaded groups' hyper-parameters and state."""
        loaded = iter(self.param_groups)
        for part in self.parts:
            for group in part.param_groups:
                group.update({k: v for k, v in next(loaded).items() if k != "params"})
            params = [p for group in part.param_groups for p in group["params"]]
            part.state.clear()
            part.state.update({p: self.state[p] for p in params if p in self.state})


def _combine(module: nn.Module, optimizers: Sequence[Optimizer]) -> bool:
    return len(optimizers) > 1 and bool(FSDP.fsdp_modules(module))


def _split(osd: dict[str, Any], optimizers: Sequence[Optimizer]) -> list[dict[str, Any]]:
    result, start = [], 0
    for opt in optimizers:
        groups = osd["param_groups"][start : start + len(opt.param_groups)]
        start += len(opt.param_groups)
        names = {name for group in groups for name in group["params"]}
        state = {k: v for k, v in osd["state"].items() if k in names and v}
        result.append({"state": state, "param_groups": groups})
    return result


def _never_stepped(optimizers: Sequence[Optimizer]) -> list[bool]:
    """Which optimizers have no state on any rank (an FSDP1 rank holding no part of an
    optimizer's parameters has none of its state, though the optimizer stepped)."""
    return _on_every_rank([not opt.state for opt in optimizers])


def _on_every_rank(local: list[bool]) -> list[bool]:
    """``local`` and-ed over the ranks (every rank passes as many flags)."""
    if not (dist.is_available() and dist.is_initialized()):
        return local
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, local)
    return [all(flags) for flags in zip(*everyone, strict=True)]


def _held(optimizers: Sequence[Optimizer]) -> list[nn.Parameter]:
    return [p for opt in optimizers for group in opt.param_groups for p in group["params"]]


@contextmanager
def _requires_grad(params: Sequence[nn.Parameter], value: bool) -> Iterator[None]:
    """``params`` with ``requires_grad=value`` inside, set back afterwards."""
    for param in params:
        param.requires_grad_(value)
    try:
        yield
    finally:
        for param in params:
            param.requires_grad_(not value)


def _stateless_for_read(
    module: nn.Module, optimizers: Sequence[Optimizer], never_stepped: Sequence[bool]
) -> list[nn.Parameter]:
    """On an FSDP1 model, the trainable parameters to read as frozen (a collective): those no
    optimizer holds, and those an optimizer that stepped holds without state on any rank
    (see [Note: trainable parameters without optimizer state])."""
    if not FSDP.fsdp_modules(module):
        return []
    held = {id(p) for p in _held(optimizers)}
    trainable = [p for p in module.parameters() if p.requires_grad]
    stepped = [opt for opt, fresh in zip(optimizers, never_stepped, strict=True) if not fresh]
    stepped_ids = {id(p) for p in _held(stepped)}
    candidates = [p for p in trainable if id(p) in stepped_ids]
    stateless = _on_every_rank([not any(p in opt.state for opt in stepped) for p in candidates])
    return [p for p in trainable if id(p) not in held] + [
        p for p, none in zip(candidates, stateless, strict=True) if none
    ]


@contextmanager
def _grads_aside(optimizers: Sequence[Optimizer]) -> Iterator[None]:
    """The gradients of ``optimizers``' parameters set to None inside, put back afterwards
    (see [Note: gradients held at a load])."""
    held = [(p, p.grad) for p in _held(optimizers) if p.grad is not None]
    for param, _ in held:
        param.grad = None
    try:
        yield
    finally:
        for param, grad in held:
            param.grad = grad


@torch.no_grad()
def _init_missing_state(optimizers: Sequence[Optimizer]) -> None:
    """Give each parameter of an optimizer that stepped, but has no state yet, the state a
    step creates (zero gradients, a zero learning rate, only those parameters), as torch
    does for an optimizer that never stepped: a target to load a checkpoint's state into."""
    for opt in optimizers:
        if not opt.state:
            continue  # torch initializes it
        params = _held([opt])
        missing = [p for p in params if p not in opt.state]
        if not missing:
            continue
        grads = [p.grad for p in params]
        lrs = [group["lr"] for group in opt.param_groups]
        for param in params:
            param.grad = None
        for param in missing:
            param.grad = torch.zeros_like(param)
        for group in opt.param_groups:
            group["lr"] = torch.zeros_like(group["lr"]) if torch.is_tensor(group["lr"]) else 0.0
        try:
            opt.step()
        finally:
            for group, lr in zip(opt.param_groups, lrs, strict=True):
                group["lr"] = lr
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad


def read_optimizer_states(
    module: nn.Module, optimizers: Sequence[Optimizer], *, full: bool, keep_init: bool = False
) -> list[dict[str, Any]]:
    """Read optimizers' state dicts keyed by parameter names (a collective).

    Args:
        module: The sharded model whose parameters the optimizers step.
        optimizers: Its optimizers.
        full: True for the gathered state, False for the sharded one.
        keep_init: Keep the state torch creates for optimizers that never stepped (to read
            into when loading); by default it is undone (see [Note: optimizers that never
            stepped]).

    Returns:
        One ``{"state": {name: ...}, "param_groups": [{..., "params": [names]}]}`` per
        optimizer (empty dicts on ranks other than 0 when the state is offloaded there).
    """
    if not optimizers:
        return []
    never_stepped = _never_stepped(optimizers)
    options = state_dict_options(module, full=full)
    native = full and reads_fsdp1_natively(module)

    def read(optimizer: Optimizer) -> dict[str, Any]:
        if native:
            return read_full_optimizer(module, optimizer, clean_name)
        return dict(get_optimizer_state_dict(module, optimizer, options=options))

    wake: list[nn.Parameter] = []
    unstepped: list[Optimizer] = []
    if keep_init:  # a target to load into: every held parameter gets a state
        _init_missing_state(optimizers)
        wake = [p for p in _held(optimizers) if not p.requires_grad]
        unstepped = [opt for opt, none in zip(optimizers, never_stepped, strict=True) if none]
    quiet = _stateless_for_read(module, optimizers, never_stepped)
    with _requires_grad(wake, True), _requires_grad(quiet, False), _grads_aside(unstepped):
        if _combine(module, optimizers):
            combined = CombinedOptimizer(optimizers)
            osd = read(combined)
            osds = _split(osd, optimizers) if osd else [{} for _ in optimizers]
        else:
            osds = [read(o) for o in optimizers]
    if not keep_init:
        for opt, osd, fresh in zip(optimizers, osds, never_stepped, strict=True):
            if fresh:
                opt.state.clear()
                if osd:
                    osd["state"] = {}
    return osds


def optimizer_param_names(module: nn.Module, optimizers: Sequence[Optimizer]) -> list[Any]:
    """For each optimizer, the names of each of its groups' parameters (a collective)."""
    osds = read_optimizer_states(module, optimizers, full=False)
    return [[list(group["params"]) for group in osd["param_groups"]] for osd in osds]


def _has_sharded_values(osds: Sequence[dict[str, Any]]) -> bool:
    return any(
        isinstance(value, torch.Tensor) and value.dim() > 0
        for osd in osds
        for values in osd["state"].values()
        for value in values.values()
    )


def _load_options(full: bool, osds: Sequence[dict[str, Any]]) -> StateDictOptions:
    # torch's gathered-state path cannot place state without a tensor to shard (e.g. SGD
    # without momentum: no state at all); such state is the same on every rank, so it is
    # loaded as it is.
    return StateDictOptions(full_state_dict=full and _has_sharded_values(osds), strict=False)


def _unheld(module: nn.Module, optimizers: Sequence[Optimizer]) -> list[nn.Parameter]:
    """On an FSDP1 model, the trainable parameters no optimizer holds."""
    if not FSDP.fsdp_modules(module):
        return []
    held = {id(p) for p in _held(optimizers)}
    return [p for p in module.parameters() if p.requires_grad and id(p) not in held]


def _frozen_with_state(
    module: nn.Module, optimizers: Sequence[Optimizer], osds: Sequence[dict[str, Any]]
) -> list[nn.Parameter]:
    """Frozen parameters the optimizers hold whose state ``osds`` carries (torch's loader
    drops the state of a frozen parameter: see [Note: frozen parameters keep their state])."""
    names = {id(p): clean_name(n) for n, p in module.named_parameters()}
    saved = {name for osd in osds for name in osd.get("state", {})}
    return [p for p in _held(optimizers) if not p.requires_grad and names.get(id(p)) in saved]


def load_optimizer_states(
    module: nn.Module,
    optimizers: Sequence[Optimizer],
    osds: Sequence[dict[str, Any]],
    *,
    full: bool,
) -> None:
    """Load named optimizer state dicts into optimizers (a collective).

    Args:
        module: The sharded model.
        optimizers: The optimizers, matched with ``osds`` by position.
        osds: Named state dicts whose groups match the optimizers' (checked beforehand).
        full: Whether the state dicts hold gathered tensors (else sharded ones).
    """
    if not optimizers:
        return
    if full and holds_dtensors(module):  # see [Note: full state onto strided shards]
        osds = [shard_optimizer_state(module, osd) for osd in osds]
        full = False
    with (
        _requires_grad(_frozen_with_state(module, optimizers, osds), True),
        _requires_grad(_unheld(module, optimizers), False),
    ):
        if _combine(module, optimizers):
            combined = CombinedOptimizer(optimizers)
            merged: dict[str, Any] = {
                "state": {k: v for osd in osds for k, v in osd["state"].items()},
                "param_groups": [group for osd in osds for group in osd["param_groups"]],
            }
            options = _load_options(full, [merged])
            set_optimizer_state_dict(module, combined, merged, options=options)
            combined.write_back()
        else:
            for opt, osd in zip(optimizers, osds, strict=True):
                set_optimizer_state_dict(module, opt, osd, options=_load_options(full, [osd]))
    for opt, osd in zip(optimizers, osds, strict=True):
        finish_optimizer_load(module, opt, osd)
