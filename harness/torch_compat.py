"""The torch versions shardcheck supports, and every private torch internal it touches.

shardcheck, the reference strategies and the suites reach into torch where no public API
says what they need (a process group's registry, an FSDP unit's flat parameter, FSDP2's
parameter groups). Private names change between releases without notice, so each one is
read here and nowhere else: one function a use, each with a ``[Note: ...]`` naming the
versions it was checked on. A new torch that renames one breaks this module only, and the
torch matrix (``ci/torch_matrix.sh``) names the function.

:func:`check_torch_version` refuses a torch older than :data:`OLDEST` at start-up in one line
(the plugin calls it before any rank starts), instead of an ``AttributeError`` on a rank.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
from torch import nn

# [Note: checkpoint wrapper] torch's activation-checkpoint wrapper (the class, the function
# and the implementation enum) lives in the private package
# ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper`` in torch 2.11 to 2.14.
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)

# [Note: wrap policy base] FSDP's auto-wrap policy base class (``ModuleWrapPolicy`` and
# ``CustomPolicy`` derive from it) is ``torch.distributed.fsdp.wrap._Policy`` in torch 2.11
# to 2.14.
from torch.distributed.fsdp.wrap import _Policy as WrapPolicyBase

__all__ = [
    "NEWEST_TESTED",
    "OLDEST",
    "CheckpointImpl",
    "CheckpointWrapper",
    "TorchVersionError",
    "WrapPolicyBase",
    "c10d_debug",
    "c10d_logger",
    "check_torch_version",
    "checkpoint_wrapper",
    "clear_mesh_stack",
    "clear_sharding_cache",
    "collective_ops",
    "created_process_groups",
    "default_group_backends",
    "drop_process_group",
    "fsdp1_flat_param_sizes",
    "fsdp1_handle",
    "fsdp1_is_root",
    "fsdp1_restore_sharded_views",
    "fsdp1_shared_params",
    "fsdp1_sync_gradients",
    "fsdp1_uses_low_precision",
    "fsdp2_mp_policy",
    "fsdp2_param_groups",
    "group_registry_state",
    "memory_tracker",
    "new_process_group_helper",
    "process_groups",
    "replace_new_process_group_helper",
    "set_default_pg_timeout",
    "torch_version",
]

#: the oldest torch the reference passes the suites on (``ci/torch_matrix.sh``); older is refused
OLDEST = (2, 11)
#: the newest torch the suites ran on here (docs/install.md, the torch matrix); newer is allowed
NEWEST_TESTED = (2, 14)


class TorchVersionError(ValueError):
    """The installed torch is older than shardcheck supports."""


def torch_version(version: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` of ``version`` (default: the installed torch's ``__version__``)."""
    text = version if version is not None else torch.__version__
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise TorchVersionError(f"cannot read a torch version from {text!r}")
    return int(match.group(1)), int(match.group(2))


def check_torch_version(version: str | None = None) -> None:
    """Refuse a torch older than :data:`OLDEST`.

    Args:
        version: the version string to check (default: the installed torch's).

    Raises:
        TorchVersionError: in one line: the version found, the range supported, the fix.
    """
    found = version if version is not None else torch.__version__
    if torch_version(found) < OLDEST:
        oldest, newest = (".".join(map(str, v)) for v in (OLDEST, NEWEST_TESTED))
        raise TorchVersionError(
            f"shardcheck needs torch {oldest} or newer (tested {oldest} to {newest}), but "
            f"torch {found} is installed; install a supported torch, e.g. "
            f"pip install 'torch>={oldest}'"
        )


# ----------------------------------------------------------------------------- FSDP2


def fsdp2_param_groups(module: Any) -> list[Any]:
    """The parameter groups of one ``fully_shard`` module (each has the ``reduce_grads`` and
    ``all_reduce_grads`` switches of its gradient sync).

    [Note: FSDP2 parameter groups] torch 2.12 and newer (checked 2.12.1, 2.13.0, 2.14.1)
    keep a list ``FSDPState._fsdp_param_groups`` (several groups when parameters live on
    different meshes) and a property ``_fsdp_param_group`` for the single group; torch 2.11
    (checked 2.11.0, PyPI's build and a GPU machine's image) has only the attribute
    ``_fsdp_param_group``, ``None`` for a module with no parameters of its own.
    """
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


def fsdp2_mp_policy(module: Any) -> Any:
    """The ``MixedPrecisionPolicy`` ``fully_shard`` was given for ``module``.

    [Note: FSDP2 policy] ``FSDPState._mp_policy`` holds it in torch 2.11 to 2.14 (checked on
    each); no public accessor exists.
    """
    return module._get_fsdp_state()._mp_policy


# ----------------------------------------------------------------------------- FSDP1


def fsdp1_handle(unit: nn.Module) -> Any:
    """The ``FlatParamHandle`` of one ``FullyShardedDataParallel`` unit, or ``None``.

    [Note: FSDP1 handle] ``FullyShardedDataParallel._handle`` in torch 2.11 to 2.14 (checked
    on each); ``None`` for a unit that manages no parameters.
    """
    return getattr(unit, "_handle", None)


def fsdp1_uses_orig_params(handle: Any) -> bool:
    """Whether the handle's unit exposes the original parameters (``use_orig_params``).

    [Note: FSDP1 handle flags] ``FlatParamHandle._use_orig_params``,
    ``_uses_param_mixed_precision`` and ``_keep_low_precision_grads`` in torch 2.11 to 2.14.
    """
    return bool(handle._use_orig_params)


def fsdp1_uses_low_precision(handle: Any) -> bool:
    """Whether the handle computes or keeps gradients in a low dtype (see
    [Note: FSDP1 handle flags])."""
    return bool(handle._uses_param_mixed_precision or handle._keep_low_precision_grads)


def fsdp1_restore_sharded_views(handle: Any) -> None:
    """Point the unit's original parameters at the flat parameter's sharded views again.

    [Note: FSDP1 sharded views] ``FlatParamHandle._use_sharded_views`` in torch 2.11 to 2.14.
    """
    handle._use_sharded_views()


def fsdp1_shared_params(handle: Any) -> list[nn.Parameter]:
    """The shared (tied) original parameters of the handle's flat parameter.

    [Note: FSDP1 shared parameters] ``FlatParameter._shared_params`` in torch 2.11 to 2.14
    (``None`` when the unit was built without original parameters).
    """
    return list(handle.flat_param._shared_params or ())


def fsdp1_sync_gradients(unit: nn.Module) -> bool:
    """Whether the unit reduces gradients in the next backward (``False`` inside
    ``no_sync()``).

    [Note: FSDP1 sync switch] ``FullyShardedDataParallel._sync_gradients`` in torch 2.11 to
    2.14.
    """
    return bool(unit._sync_gradients)


def fsdp1_is_root(unit: nn.Module) -> bool | None:
    """Whether FSDP decided the unit is a root (``None`` before its first forward).

    [Note: FSDP1 root flag] ``FullyShardedDataParallel._is_root`` in torch 2.11 to 2.14.
    """
    return getattr(unit, "_is_root", None)


def fsdp1_flat_param_sizes(unit: nn.Module) -> tuple[int, int, int, int] | None:
    """``(local numel, unsharded numel, parameters' numel, parameter count)`` of the unit's
    flat parameter, or ``None`` for a unit that manages no parameters.

    [Note: FSDP1 flat parameter] ``FullyShardedDataParallel._flat_param`` and the flat
    parameter's ``_unpadded_unsharded_size`` and ``_numels`` in torch 2.11 to 2.14.
    """
    flat = getattr(unit, "_flat_param", None)
    if flat is None:
        return None
    numels = list(flat._numels)
    return flat.numel(), flat._unpadded_unsharded_size.numel(), sum(numels), len(numels)


# ----------------------------------------------------------------------------- c10d


def c10d_debug() -> Any:
    """The C++ c10d module with ``get_debug_level``/``set_debug_level``/``DebugLevel``.

    [Note: c10d debug level] ``torch._C._distributed_c10d`` in torch 2.11 to 2.14; the public
    ``torch.distributed.set_debug_level`` reads the environment only.
    """
    return torch._C._distributed_c10d


def c10d_logger() -> logging.Logger:
    """The logger every c10d collective logs its exception to before raising it.

    [Note: c10d logger] ``torch.distributed.c10d_logger._c10d_logger`` in torch 2.11 to 2.14.
    """
    from torch.distributed.c10d_logger import _c10d_logger

    return _c10d_logger


def new_process_group_helper() -> Callable[..., Any]:
    """The function every process group (the default one included) is created through.

    [Note: group creation hook] ``distributed_c10d._new_process_group_helper`` in torch 2.11
    to 2.14; the collective checker wraps it so each new group gets the checking wrapper.
    """
    from torch.distributed import distributed_c10d

    return distributed_c10d._new_process_group_helper


def replace_new_process_group_helper(helper: Callable[..., Any]) -> None:
    """Install ``helper`` in place of :func:`new_process_group_helper`'s function."""
    from torch.distributed import distributed_c10d

    distributed_c10d._new_process_group_helper = helper


def set_default_pg_timeout(seconds: float) -> None:
    """Set the default process group's timeout for the collectives that follow.

    [Note: group timeout] The public ``torch.distributed.set_timeout`` where torch has it
    (2.14.1 has it, and warns that ``_set_pg_timeout`` is deprecated: every rank job would
    print that warning); else ``distributed_c10d._set_pg_timeout`` (torch 2.11 to 2.14.0).
    Either knows unwrapped gloo and NCCL groups only; :func:`default_group_backends` reaches
    a wrapped one.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    set_timeout = getattr(dist, "set_timeout", None)
    if callable(set_timeout):
        set_timeout(timedelta(seconds=seconds))
    else:
        distributed_c10d._set_pg_timeout(timedelta(seconds=seconds))


def default_group_backends() -> Iterator[Any]:
    """The backends of the default process group, unwrapped from a checking wrapper, that
    can take a new default timeout (``_set_default_timeout``).

    [Note: group backends] ``ProcessGroup._device_types``, ``_get_backend`` and
    ``wrapped_pg`` of torch's checking wrapper in torch 2.11 to 2.14.
    """
    from torch.distributed import distributed_c10d

    group = distributed_c10d._get_default_group()
    for device in group._device_types:
        backend: Any = group._get_backend(device)
        inner = getattr(backend, "wrapped_pg", backend)
        if hasattr(inner, "_set_default_timeout"):
            yield inner


def process_groups() -> set[Any]:
    """Every process group alive in this process.

    [Note: group registry] ``distributed_c10d._world`` (``pg_map``, ``pg_names``,
    ``group_count``) in torch 2.11 to 2.14.
    """
    from torch.distributed import distributed_c10d

    return set(distributed_c10d._world.pg_map)


def created_process_groups(before: set[Any]) -> list[Any]:
    """The process groups alive now that were not in ``before`` (see [Note: group registry])."""
    from torch.distributed import distributed_c10d

    return [pg for pg in distributed_c10d._world.pg_map if pg not in before]


def drop_process_group(group: Any) -> None:
    """Remove a group that ``destroy_process_group`` could not destroy from the registry
    (see [Note: group registry])."""
    from torch.distributed import distributed_c10d

    distributed_c10d._world.pg_map.pop(group, None)
    distributed_c10d._world.pg_names.pop(group, None)


def group_registry_state() -> dict[str, Any]:
    """How many groups this process has created and their names (see
    [Note: group registry]): equal on every rank while the ranks are in step."""
    from torch.distributed import distributed_c10d

    world = distributed_c10d._world
    return {
        "group_count": world.group_count,
        "groups": sorted(str(name) for name in world.pg_names.values()),
    }


def clear_mesh_stack() -> None:
    """Forget the device meshes a job left entered (``with mesh:``).

    [Note: mesh stack] ``device_mesh._mesh_resources.mesh_stack`` in torch 2.11 to 2.14;
    absent is fine (nothing to clear).
    """
    mesh_resources = getattr(torch.distributed.device_mesh, "_mesh_resources", None)
    stack = getattr(mesh_resources, "mesh_stack", None)
    if stack:
        stack.clear()


def clear_sharding_cache() -> None:
    """Empty DTensor's caches that keep device meshes, and so their process groups, alive.

    [Note: sharding cache] ``torch.distributed.tensor.debug._clear_sharding_prop_cache`` in
    torch 2.11 to 2.14: the sharding-propagation cache keeps meshes that compare equal to a
    new one but name destroyed groups.

    [Note: DTensor caches keep groups alive] A device mesh holds its process groups (the
    dict ``DeviceMesh._pg_registry`` in torch 2.13), and three more DTensor caches keep
    meshes after the job that made them ended, each mesh keeping its destroyed gloo groups'
    worker and TCP-loop threads running: ``_redistribute._planner_cache`` (keyed by a weak
    reference to the mesh, but its value, the planner, holds the mesh itself),
    ``_redistribute._gen_transform_infos`` (a ``functools.cache`` keyed by the specs, which
    hold the mesh) and ``_collective_utils.MeshTopoInfo.build_from_mesh`` (an
    ``lru_cache``). On torch 2.13.0, over a ``CKPT-*`` run a world-4 rank went from 9
    threads to 144 with only the sharding cache cleared (every dead group's threads were
    reached through a planner). All three exist in 2.11.0, 2.13.0 and 2.14.1 (checked with
    ``tests/harness/test_rank_usage.py`` in each); any of them missing in another release is
    fine: nothing to clear there.
    """
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    for module, name in (
        ("torch.distributed.tensor._redistribute", "clear_redistribute_planner_cache"),
        ("torch.distributed.tensor._redistribute", "_gen_transform_infos.cache_clear"),
        ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh.cache_clear"),
    ):
        clear = _attribute(module, name)
        if callable(clear):
            clear()


def memory_tracker() -> type[Any] | None:
    """torch's ``MemTracker`` (a dispatch mode that counts the bytes of every storage it sees,
    by category: parameters, buffers, gradients, optimizer state, activations, temporaries),
    made to accept FSDP1's parameter views, or ``None`` where this torch has none (the cost
    checks then read ``environment``).

    [Note: memory tracker] ``torch.distributed._tools.mem_tracker.MemTracker`` in torch 2.13.0
    (the release this was written and run on; 2.11 and 2.14 not checked), with
    ``track_external``, ``reset_mod_stats``, ``get_tracker_snapshot("current" | "peak")``
    and the category names ``Parameter``, ``Buffer``, ``Gradient``, ``Activation``,
    ``Temp``, ``Optstate`` and ``Other`` (``_MemRefType``); it runs on CPU. It counts what
    passes through the dispatcher inside its context and the storages ``track_external``
    names, so a storage made outside both (a C++ collective's own buffers) is not seen.

    [Note: FSDP1's parameter views] At each module's first forward, MemTracker's private
    ``_track_module_params_and_buffers`` registers a post-accumulate-grad hook on every
    parameter, which raises for FSDP1's ``use_orig_params`` parameters (views of the flat
    parameter while unsharded, not leaves). The subclass here asks for no hooks on a module
    with such a parameter: its storages are still counted, and its gradients are counted
    when the backward makes them (as temporaries until an optimizer step or a later
    ``track_external`` files them as gradients), so the peak total is unchanged.
    """
    base = _attribute("torch.distributed._tools.mem_tracker", "MemTracker")
    if not isinstance(base, type):
        return None

    class _LeafSafeMemTracker(base):  # type: ignore[misc, valid-type]
        def _track_module_params_and_buffers(
            self, module: nn.Module, install_grad_hooks: bool = True
        ) -> tuple[int, int]:
            leaves = all(p.is_leaf for p in module.parameters())
            result: tuple[int, int] = super()._track_module_params_and_buffers(
                module, install_grad_hooks=install_grad_hooks and leaves
            )
            return result

    return _LeafSafeMemTracker


@functools.cache
def collective_ops() -> tuple[frozenset[Any], dict[Any, Any]]:
    """The collective ops torch's ``CommDebugMode`` counts: the c10d ones (``_allgather_base_``,
    ``_reduce_scatter_base_``, ``allreduce_``, ...) and the map from the native functional
    ops to the Python ones it files them under.

    [Note: CommDebugMode's op registry] ``c10d_collective_ops`` and ``NATIVE_TO_PY_MAPPING``
    of the private ``torch.distributed.tensor.debug._comm_mode`` in torch 2.13.0 (2.11 and
    2.14 not checked); where either is missing, the functional ops alone are counted (the
    mode's own ``comm_registry``) and an empty set and map come back.
    """
    c10d = _attribute("torch.distributed.tensor.debug._comm_mode", "c10d_collective_ops")
    mapping = _attribute("torch.distributed.tensor.debug._comm_mode", "NATIVE_TO_PY_MAPPING")
    return frozenset(c10d or ()), dict(mapping or {})


def _attribute(module: str, dotted: str) -> Any:
    """``module.dotted`` if the module imports and has it, else ``None``."""
    import importlib

    try:
        value: Any = importlib.import_module(module)
    except ImportError:
        return None
    for part in dotted.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value
