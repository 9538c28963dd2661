"""The sharded format: a ``torch.distributed.checkpoint`` directory plus ``meta.pt``.

The DCP part holds the sharded model state dict under the model's key, each optimizer's
sharded state dict (keyed by parameter names) under its key, and a list of such dicts for
a list of optimizers. ``meta.pt`` (``torch.save`` by rank 0) holds the other entries.

Saving writes into a fresh sibling directory and moves it into place at the end, so a
failed save never leaves half a checkpoint at the path nor destroys the previous one (a
directory that is not a checkpoint is written into, keeping the files it holds). Loading
compares the checkpoint's layout with what is requested before it reads any tensor, then
lets DCP reshard into the current model (any world size, CKPT-RT-3).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from reference_impl.checkpoint.dcp_io import (
    SafeLoadPlanner,
    SafeReader,
    checkpoint_layout,
    dcp_errors,
)
from reference_impl.checkpoint.files import (
    METADATA_FILE,
    PathPlan,
    rank0_run,
    remove_path,
    replace_with,
    safe_torch_load,
    this_rank,
    write_file_atomically,
)
from reference_impl.checkpoint.optimizers import load_optimizer_states, read_optimizer_states
from reference_impl.checkpoint.rekey import check_param_groups
from reference_impl.checkpoint.restore import check_model_keys, require_keys, restore_metadata
from reference_impl.checkpoint.state import StateEntries, is_stateful, read_model_state

__all__ = ["load_sharded", "save_sharded"]


def save_sharded(plan: PathPlan, state: Mapping[str, Any], entries: StateEntries) -> None:
    """Write a sharded checkpoint directory (a collective).

    Args:
        plan: The agreed path; a file or a sharded checkpoint there is replaced.
        state: The caller's state.
        entries: ``state`` sorted by kind.
    """
    model = entries.model
    content: dict[str, Any] = {entries.model_key: read_model_state(model, full=False)}
    content.update(
        entries.regroup(read_optimizer_states(model, entries.all_optimizers(), full=False))
    )
    metadata = {k: v.state_dict() if is_stateful(v) else v for k, v in entries.metadata.items()}
    in_place = plan.kind == "directory"
    target = plan.path if in_place else plan.temp
    try:
        with dcp_errors("save the sharded checkpoint", plan.path):
            dcp.save(content, checkpoint_id=target)
    except BaseException:
        if not in_place and this_rank() == 0:
            remove_path(plan.temp)
        raise

    def finish() -> None:
        meta_path = target / METADATA_FILE
        write_file_atomically(metadata, meta_path.with_name(f".{METADATA_FILE}.partial"), meta_path)
        if not in_place:
            replace_with(plan.temp, plan.path)

    try:
        rank0_run(f"finish the sharded checkpoint {str(plan.path)!r}", finish)
    finally:
        if not in_place and this_rank() == 0 and plan.temp.exists():
            remove_path(plan.temp)


def _load_target(
    entries: StateEntries, layout: Mapping[Any, Any], *, strict: bool, where: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What to ask DCP for (only what the checkpoint has), and the full model target."""
    model = entries.model
    target_model = read_model_state(model, full=False)
    where_model = f"{entries.model_key!r} in {where}"
    saved_model = layout.get(entries.model_key, {})
    keys = check_model_keys(
        target_model.keys(), saved_model.keys(), strict=strict, where=where_model
    )
    request: dict[str, Any] = {}
    if entries.model_key in layout:
        request[entries.model_key] = {k: target_model[k] for k in keys}
    optimizers = entries.all_optimizers()
    current = entries.regroup(read_optimizer_states(model, optimizers, full=False, keep_init=True))
    for key in entries.optimizers:
        if key in layout:
            request[key] = _optimizer_request(current[key], layout[key], f"optimizer {key!r}")
    for key, opts in entries.optimizer_lists.items():
        if key not in layout:
            continue
        saved = layout[key]
        if not all(isinstance(index, int) for index in saved):
            raise ValueError(
                f"The checkpoint {where} holds one optimizer state under {key!r}, not a list; "
                f"pass a single optimizer under {key!r}."
            )
        if len(saved) != len(opts):
            raise RuntimeError(
                f"The checkpoint {where} holds {len(saved)} optimizer state(s) under {key!r}, "
                f"but {len(opts)} optimizer(s) were passed to load them into; pass exactly "
                f"as many optimizers, in the order they were saved."
            )
        request[key] = [
            _optimizer_request(current[key][i], saved[i], f"optimizer {i} of {key!r}")
            for i in range(len(opts))
        ]
    return request, target_model


def _optimizer_request(
    current: dict[str, Any], saved: Mapping[Any, Any], what: str
) -> dict[str, Any]:
    """The optimizer's own (initialized) state, restricted to what the checkpoint holds."""
    saved_groups = saved.get("param_groups", {})
    if len(saved_groups) != len(current["param_groups"]):
        raise ValueError(
            f"The checkpoint's state for {what} has {len(saved_groups)} parameter group(s) "
            f"but the optimizer has {len(current['param_groups'])}; create the optimizer "
            f"with the same parameter groups as the one that was saved."
        )
    saved_state = saved.get("state", {})
    state = {
        name: {k: v for k, v in values.items() if k in saved_state[name]}
        for name, values in current["state"].items()
        if name in saved_state
    }
    groups = [
        {k: v for k, v in group.items() if k in saved_groups[i]}
        for i, group in enumerate(current["param_groups"])
    ]
    return {"state": state, "param_groups": groups, "names": current["param_groups"]}


def _dcp_load(request: dict[str, Any], plan: PathPlan) -> None:
    with dcp_errors("load the sharded checkpoint", plan.path):
        dcp.load(request, storage_reader=SafeReader(plan.path), planner=SafeLoadPlanner())


def _check_groups(request: Mapping[str, Any], entries: StateEntries, plan: PathPlan) -> None:
    """Read only the saved groups' parameter names, and compare them with the optimizers'."""
    names_only: dict[str, Any] = {}
    for key, value in request.items():
        if key in entries.optimizers:
            names_only[key] = {"param_groups": [{"params": None} for _ in value["names"]]}
        elif key in entries.optimizer_lists:
            names_only[key] = [
                {"param_groups": [{"params": None} for _ in v["names"]]} for v in value
            ]
    if not names_only:
        return
    _dcp_load(names_only, plan)
    for key, value in names_only.items():
        pairs = (
            [(value, request[key], f"optimizer {key!r}")]
            if isinstance(value, dict)
            else [
                (v, r, f"optimizer {i} of {key!r}")
                for i, (v, r) in enumerate(zip(value, request[key], strict=True))
            ]
        )
        for saved, req, what in pairs:
            current = [list(g["params"]) for g in req.pop("names")]
            check_param_groups(saved, current, where=f"{what} in {str(plan.path)!r}")
            for group, saved_group in zip(req["param_groups"], saved["param_groups"], strict=True):
                group["params"] = saved_group["params"]


def load_sharded(
    plan: PathPlan, state: MutableMapping[str, Any], entries: StateEntries, *, strict: bool
) -> dict[str, Any]:
    """Load a sharded checkpoint directory into ``state`` (a collective).

    Args:
        plan: The agreed path (a sharded checkpoint directory).
        state: The caller's state; metadata is restored into it in place.
        entries: ``state`` sorted by kind.
        strict: See ``load_checkpoint``.

    Returns:
        The entries of ``meta.pt`` that ``state`` did not request.
    """
    where = repr(str(plan.path))
    meta_path = plan.path / METADATA_FILE
    metadata = safe_torch_load(meta_path) if meta_path.is_file() else {}
    layout = checkpoint_layout(SafeReader(plan.path).read_metadata())
    requested = [entries.model_key, *entries.optimizers, *entries.optimizer_lists]
    if strict:
        require_keys(requested, layout.keys(), where=where)
        require_keys(entries.metadata, metadata.keys(), where=f"{where} ({METADATA_FILE})")
    never_stepped = [opt for opt in entries.all_optimizers() if not opt.state]
    try:
        request, target_model = _load_target(entries, layout, strict=strict, where=where)
        _check_groups(request, entries, plan)
    except BaseException:
        for opt in never_stepped:  # reading the targets initialized them: undo that
            opt.state.clear()
        raise
    _dcp_load(request, plan)
    model = entries.model
    if entries.model_key in request:
        target_model.update(request[entries.model_key])
        set_model_state_dict(model, target_model, options=StateDictOptions(strict=strict))
    optimizers = [entries.optimizers[k] for k in entries.optimizers if k in request]
    osds = [request[k] for k in entries.optimizers if k in request]
    for key, opts in entries.optimizer_lists.items():
        if key in request:
            optimizers += opts
            osds += request[key]
    load_optimizer_states(model, optimizers, osds, full=False)
    restore_metadata(state, entries.metadata, metadata, strict=strict)
    return {k: v for k, v in metadata.items() if k not in entries.metadata}
