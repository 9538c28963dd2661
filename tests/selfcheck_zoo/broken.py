"""A zoo of real bugs: the reference strategies with one reported bug each.

Each bug was reported against FSDP, ``torch.distributed.checkpoint`` (DCP), Lightning or a
training framework built on them; the class docstring cites the upstream issue. The first
ones are checkpoint bugs; the last ones need the transformer-shaped zoo (a parameter on the
root module, a module called twice, rotary tables held as non-persistent buffers).

As in ``tests/selfcheck_ckpt/broken.py``, each factory builds the reference strategy with
``reference_impl.make_strategy`` and gives it a subclass whose one overridden method carries
the bug (the bug itself is a patch of one reference helper, active only inside that method).
``test_zoo_caught.py`` runs the suites against each factory (``--strategy
selfcheck_zoo.broken:<factory>``) on the clause it breaks, and the reference on the same
selection.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Iterator, Mapping
from typing import Any
from unittest import mock

import torch
from selfcheck_ckpt.broken import _clean, _with_bug
from torch import Tensor, nn

import reference_impl
from harness.contract import StrategySpec

__all__ = [
    "chunks_optimizer_state_to_empty_shards",
    "leaves_root_parameters_out_of_units",
    "loses_repeated_call_gradients",
    "no_reset_for_buffer_only_modules",
    "rekeys_without_frozen_parameters",
    "saves_non_persistent_buffers",
    "saves_tied_weight_once",
    "saves_wrapper_prefixed_keys",
]


def _model_of(state: Any) -> nn.Module | None:
    if not isinstance(state, dict):
        return None
    return next((v for v in state.values() if isinstance(v, nn.Module)), None)


@contextlib.contextmanager
def _model_state_reader(change: Any) -> Iterator[None]:
    """Patch the model-state reader of both formats' save paths with ``change(module, sd)``."""
    from reference_impl.checkpoint import full, sharded

    original = full.read_model_state

    def read(module: nn.Module, *, full: bool, rank0_only: bool = True) -> dict[str, Any]:
        return change(module, original(module, full=full, rank0_only=rank0_only))

    with mock.patch.object(full, "read_model_state", read):
        with mock.patch.object(sharded, "read_model_state", read):
            yield


# --- non-persistent buffers ---------------------------------------------------------------


def _non_persistent_buffers(module: nn.Module) -> dict[str, Tensor]:
    found = {}
    for prefix, owner in module.named_modules():
        for name in getattr(owner, "_non_persistent_buffers_set", ()):
            buffer = owner._buffers.get(name)
            if buffer is not None:
                found[_clean(f"{prefix}.{name}" if prefix else name)] = buffer
    return found


class SavesNonPersistentBuffers:
    """The saved model state lists the buffers of ``named_buffers()``, non-persistent ones
    included, so a checkpoint holds them and a strict load of it meets keys that the
    model's ``state_dict()`` does not have.

    Upstream: pytorch/pytorch#122792, "[DCP] `set_model_state_dict` errors on compiled
    module with non-persistent buffer" (DCP's state-dict helpers walked ``named_buffers()``;
    fixed by pytorch/pytorch#125337, "[DSD] Fix to remove non_persistent buffer in
    distributed state dict"); FSDP1 had the same bug before pytorch/pytorch#85740, "[FSDP]
    Ignore buffers that are non-persistent".
    """

    def save_checkpoint(
        self, path: Any, state: dict, storage_options: Any = None, filter: Any = None
    ) -> None:
        def with_buffers(module: nn.Module, sd: dict[str, Any]) -> dict[str, Any]:
            extra = _non_persistent_buffers(module)
            return {**sd, **{k: v.detach().clone() for k, v in extra.items() if k not in sd}}

        with _model_state_reader(with_buffers):
            super().save_checkpoint(path, state, storage_options, filter)  # type: ignore[misc]


# --- empty shards -------------------------------------------------------------------------


def _chunk_like(full: Tensor, like: Any, name: str) -> Any:
    """``like``'s shard of ``full`` cut with ``torch.chunk``, as ``ChunkShardingSpec`` cut it.

    ``torch.chunk`` returns fewer pieces than ranks when a dimension is shorter than the
    mesh (a 1-element tensor over 2 ranks gives 1 piece), so the rank whose shard is empty
    finds no piece. Parameters on a 2-D mesh keep the reference cut.
    """
    from torch.distributed.tensor import DTensor, Shard

    from reference_impl.checkpoint.local_shards import shard_like

    mesh, placements = like.device_mesh, like.placements
    if mesh.ndim != 1 or type(placements[0]) is not Shard:
        return shard_like(full, like, name=name)
    pieces = torch.chunk(full.detach(), mesh.size(), dim=placements[0].dim)
    local = pieces[mesh.get_local_rank()]  # the bug: IndexError on an empty shard's rank
    return DTensor.from_local(
        local.to(like.device), mesh, placements, run_check=False, shape=like.shape,
        stride=like.stride(),
    )  # fmt: skip


def _chunked_optimizer_state(module: nn.Module, osd: Mapping[str, Any]) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    params = {
        _clean(name): p
        for name, p in module.named_parameters(remove_duplicate=False)
        if isinstance(p, DTensor)
    }
    state: dict[str, Any] = {}
    for name, values in osd.get("state", {}).items():
        param = params.get(name)
        if param is None or not isinstance(values, Mapping):
            state[name] = values
            continue
        state[name] = {
            key: _chunk_like(value, param, f"optimizer state {key!r} of {name!r}")
            if isinstance(value, Tensor) and value.dim() > 0 and value.shape == param.shape
            else value
            for key, value in values.items()
        }
    return {**osd, "state": state}


class ChunksOptimizerStateToEmptyShards:
    """Loading a full checkpoint into DTensor (FSDP2) parameters cuts each optimizer state
    tensor with ``torch.chunk``: a rank whose shard of a small parameter is empty (a
    1-element parameter over 2 data-parallel ranks) gets no piece and the load fails there.

    Upstream: pytorch/pytorch#102821, "Unable to resume job using FSDP with 64 nodes, errors
    appeared during loading sharded optimizer state dict" (the empty-shard case of
    ``chunk_sharding_spec.py`` when loading optimizer state; a maintainer points to the fix
    in pytorch/pytorch#108915).
    """

    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True) -> Any:
        from reference_impl.checkpoint import optimizers

        with mock.patch.object(optimizers, "shard_optimizer_state", _chunked_optimizer_state):
            return super().load_checkpoint(path, state, strict)  # type: ignore[misc]


# --- frozen parameters --------------------------------------------------------------------


class RekeysWithoutFrozenParameters:
    """Integer optimizer ids are mapped to the names of the *trainable* parameters only, as
    if frozen parameters were never in the optimizer; a plain optimizer that holds frozen
    parameters numbers them too, so every id after the first frozen one lands on the wrong
    parameter (``zip`` drops the ids left over).

    Upstream: pytorch/pytorch#192202, "[DCP] Optimizer states for frozen parameters are
    dropped during loading and prevent partial state initialization"
    (``set_optimizer_state_dict`` selected parameters by ``requires_grad`` when mapping saved
    optimizer state to parameters; pytorch/pytorch#192307 keys it on the checkpoint instead).
    """

    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True) -> Any:
        model = _model_of(state)
        if model is None:
            return super().load_checkpoint(path, state, strict)  # type: ignore[misc]
        trainable = {_clean(n) for n, p in model.named_parameters() if p.requires_grad}
        with _rekey_trainable_only(trainable):
            return super().load_checkpoint(path, state, strict)  # type: ignore[misc]


@contextlib.contextmanager
def _rekey_trainable_only(trainable: set[str]) -> Iterator[None]:
    from reference_impl.checkpoint import full

    def rekey(standard: Any, group_names: Any, *, where: str = "") -> dict[str, Any]:
        groups = [
            {**g, "params": list(names)}
            for g, names in zip(standard["param_groups"], group_names, strict=True)
        ]
        order = [n for names in group_names for n in names if n in trainable]  # the bug
        ids = dict(zip(itertools.count(), order))
        state = {ids[i]: v for i, v in standard["state"].items() if i in ids}
        return {"state": state, "param_groups": groups}

    with mock.patch.object(full, "to_named_optimizer_state", rekey):
        yield


# --- wrapper prefixes ---------------------------------------------------------------------

_PREFIX = "_forward_module."


class SavesWrapperPrefixedKeys:
    """The saved model state is the state dict of a wrapper around the model: every key of
    a checkpoint starts with ``_forward_module.``, so the plain model cannot load it with
    ``load_state_dict`` (and the strategy's own strict load finds every key missing).

    Upstream: Lightning-AI/pytorch-lightning#16526, "Proper extraction of `state_dict` for
    `fsdp` strategy" (the FSDP strategy's checkpoints carried the ``_forward_module.`` prefix
    of Lightning's module wrapper; fixed by Lightning-AI/pytorch-lightning#16558); the same
    class of bug in DCP: pytorch/pytorch#117399, "CHECKPOINT_PREFIX is not stripped when
    non-root module is activation checkpointed".
    """

    def save_checkpoint(
        self, path: Any, state: dict, storage_options: Any = None, filter: Any = None
    ) -> None:
        def prefixed(module: nn.Module, sd: dict[str, Any]) -> dict[str, Any]:
            return {f"{_PREFIX}{k}": v for k, v in sd.items()}

        with _model_state_reader(prefixed):
            super().save_checkpoint(path, state, storage_options, filter)  # type: ignore[misc]


# --- tied (shared) parameters -------------------------------------------------------------


def _alias_names(module: nn.Module) -> set[str]:
    """Every name of a shared parameter but its first (``head.weight`` of a tied head)."""
    first: dict[int, str] = {}
    aliases = set()
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for name, param in owner._parameters.items():
            if param is None:
                continue
            full_name = _clean(f"{prefix}.{name}" if prefix else name)
            if first.setdefault(id(param), full_name) != full_name:
                aliases.add(full_name)
    return aliases


class SavesTiedWeightOnce:
    """A shared (tied) parameter is saved under its first name only: the checkpoint lacks
    the tied head's ``head.weight``, so a strict load of the model, by the strategy or by
    plain torch, misses that key.

    Upstream: pytorch/pytorch#86524, "[FSDP] Fix load_sharded_state_dict FQN mismatches for
    shared parameters" (FSDP's sharded state dict named a shared parameter by one FQN only);
    the same bug in Hugging Face Accelerate's FSDP checkpoints: huggingface/accelerate#2807,
    "save_state removes shared weights but load_state cannot load properly" ("Missing
    key(s) in state_dict: ... lm_head.weight").
    """

    def save_checkpoint(
        self, path: Any, state: dict, storage_options: Any = None, filter: Any = None
    ) -> None:
        def first_names_only(module: nn.Module, sd: dict[str, Any]) -> dict[str, Any]:
            aliases = _alias_names(module)
            return {k: v for k, v in sd.items() if k not in aliases}

        with _model_state_reader(first_names_only):
            super().save_checkpoint(path, state, storage_options, filter)  # type: ignore[misc]


# --- a parameter on the root module -------------------------------------------------------


class LeavesRootParametersOutOfUnits:
    """The auto-wrap policy decides the units and only the modules it picks are sharded:
    parameters registered directly on the root module belong to no unit, so they are never
    all-reduced and each rank trains them on its own batch alone (FSDP1's
    ``ignored_states``, which keeps them out of every flat parameter, plays that part).

    Upstream: facebookresearch/fairscale#791, "Allreduce modules that are ignored by
    auto_wrap" (``auto_wrap`` applied the policy to children only; what it left out of every
    FSDP instance was not all-reduced unless the user wrapped the root too; fixed by
    facebookresearch/fairscale#930, "[fix] Add option to wrap root module in auto_wrap").
    """

    def setup_module(self, module: nn.Module) -> nn.Module:
        own = list(module.parameters(recurse=False))
        if own:
            self._fsdp_kwargs = {**self._fsdp_kwargs, "ignored_states": own}  # type: ignore[has-type]
        return super().setup_module(module)  # type: ignore[misc]


# --- a module called twice in one forward -------------------------------------------------


def _in_backward() -> bool:
    return bool(torch._C._current_graph_task_id() != -1)


class LosesRepeatedCallGradients:
    """A module called twice in one forward gets the gradient of one call only: the
    parameter gradient of every later call is dropped (here: a hook zeroes the gradient of
    the parameter views that call used), as if each call's gradient reduction overwrote,
    instead of accumulating into, the previous one.

    Upstream: facebookresearch/fairscale#780 (an FSDP module called several times within a
    forward: "Ensure gradient reduction accumulates into the unsharded gradient tensor
    within a backwards pass", fixed by facebookresearch/fairscale#784, "[fix] FSDP
    intra-backwards gradient accumulation"). FSDP1 with ``use_orig_params=True`` hands each
    call fresh views of the flat parameter, which is what the hook attaches to.
    """

    def setup_module(self, module: nn.Module) -> nn.Module:
        names = {id(m): [n for n, _ in m.named_parameters(recurse=False)] for m in module.modules()}
        wrapped = super().setup_module(module)  # type: ignore[misc]
        calls: dict[int, int] = {}
        wrapped.register_forward_pre_hook(lambda *_: None if _in_backward() else calls.clear())
        for sub in module.modules():
            if names.get(id(sub)):
                hook = functools.partial(_drop_repeated, names=names[id(sub)], calls=calls)
                sub.register_forward_pre_hook(hook)
        return wrapped


def _drop_repeated(
    module: nn.Module, _args: Any, *, names: list[str], calls: dict[int, int]
) -> None:
    if _in_backward() or not torch.is_grad_enabled():  # recomputation under checkpointing
        return
    calls[id(module)] = calls.get(id(module), 0) + 1
    if calls[id(module)] < 2:
        return
    for name in names:
        view = getattr(module, name, None)
        if isinstance(view, Tensor) and view.requires_grad and view.grad_fn is not None:
            view.register_hook(torch.zeros_like)  # the bug: this call's gradient is lost


# --- non-persistent buffers after meta-device init ----------------------------------------


def _owns_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False))


def _as_uninitialized(module: nn.Module) -> None:
    """What ``to_empty`` left in ``module``'s own buffers: NaN, as torch writes into new
    memory under ``torch.utils.deterministic.fill_uninitialized_memory`` (real leftover
    memory could happen to hold the right values from an earlier job of the rank)."""
    with torch.no_grad():
        for buffer in module.buffers(recurse=False):
            if buffer.is_floating_point():
                buffer.fill_(float("nan"))


@contextlib.contextmanager
def _buffer_only_modules_not_reset() -> Iterator[None]:
    """Materialize meta modules, but call ``reset_parameters()`` only on modules that own
    parameters: a module that owns only buffers is allocated and left uninitialized."""
    from reference_impl import meta_init, model_parallel_ops

    call, materialize = meta_init.MetaMaterializer.__call__, model_parallel_ops.materialize

    def fsdp1_call(self: Any, module: nn.Module) -> None:
        if _owns_parameters(module) or not meta_init.owns_state(module) or id(module) in self._done:
            return call(self, module)
        self._done.add(id(module))
        module.to_empty(device=self.device, recurse=False)
        _as_uninitialized(module)

    def fsdp2_materialize(module: nn.Module, device: torch.device) -> None:
        with mock.patch.object(meta_init, "owns_state", _owns_parameters):
            materialize(module, device)
        for sub in module.modules():
            if not _owns_parameters(sub):
                _as_uninitialized(sub)

    with mock.patch.object(meta_init.MetaMaterializer, "__call__", fsdp1_call):
        with mock.patch.object(model_parallel_ops, "materialize", fsdp2_materialize):
            yield


class NoResetForBufferOnlyModules:
    """Meta-device init allocates every module with ``to_empty`` but calls
    ``reset_parameters()`` only where a module owns parameters, so a module that owns only
    buffers (the rotary tables: non-persistent, never in a checkpoint to restore them from)
    keeps uninitialized memory, silently.

    Upstream: pytorch/torchtitan#4783, "rotary inv_freq is left uninitialized after
    `to_empty()`" (loss starting near random, nothing raises); the same in
    huggingface/transformers#34234, "`LlamaRotaryEmbedding` `inv_freq` buffer is left
    uninitialized by `init_empty_weights` + `load_checkpoint_and_dispatch`", and in FSDP1 meta
    init, NovaSky-AI/SkyRL#1709.
    """

    def setup_module(self, module: nn.Module) -> nn.Module:
        with _buffer_only_modules_not_reset():
            return super().setup_module(module)  # type: ignore[misc]


# --- factories ----------------------------------------------------------------------------


def _fsdp_only(spec: StrategySpec, bug: type) -> Any:
    """The bug on the fsdp family (its hooks are FSDP1's); the model_parallel family as is."""
    return _with_bug(spec, bug) if spec.family == "fsdp" else reference_impl.make_strategy(spec)


def saves_non_persistent_buffers(spec: StrategySpec) -> Any:
    """Factory: :class:`SavesNonPersistentBuffers` (breaks CKPT-BUF-1)."""
    return _with_bug(spec, SavesNonPersistentBuffers)


def chunks_optimizer_state_to_empty_shards(spec: StrategySpec) -> Any:
    """Factory: :class:`ChunksOptimizerStateToEmptyShards` (breaks CKPT-TRAINER-1)."""
    return _with_bug(spec, ChunksOptimizerStateToEmptyShards)


def rekeys_without_frozen_parameters(spec: StrategySpec) -> Any:
    """Factory: :class:`RekeysWithoutFrozenParameters` (breaks CKPT-REKEY-1)."""
    return _with_bug(spec, RekeysWithoutFrozenParameters)


def saves_wrapper_prefixed_keys(spec: StrategySpec) -> Any:
    """Factory: :class:`SavesWrapperPrefixedKeys` (breaks CKPT-REKEY-2)."""
    return _with_bug(spec, SavesWrapperPrefixedKeys)


def saves_tied_weight_once(spec: StrategySpec) -> Any:
    """Factory: :class:`SavesTiedWeightOnce` (breaks CKPT-RT-2)."""
    return _with_bug(spec, SavesTiedWeightOnce)


def leaves_root_parameters_out_of_units(spec: StrategySpec) -> Any:
    """Factory: :class:`LeavesRootParametersOutOfUnits` for the fsdp family (breaks TRAIN-1)."""
    return _fsdp_only(spec, LeavesRootParametersOutOfUnits)


def loses_repeated_call_gradients(spec: StrategySpec) -> Any:
    """Factory: :class:`LosesRepeatedCallGradients` for the fsdp family (breaks TRAIN-1)."""
    return _fsdp_only(spec, LosesRepeatedCallGradients)


def no_reset_for_buffer_only_modules(spec: StrategySpec) -> Any:
    """Factory: :class:`NoResetForBufferOnlyModules` (breaks INIT-1)."""
    return _with_bug(spec, NoResetForBufferOnlyModules)
