"""Controller-side checks of the checkpoint suites.

Moved state is compared bitwise (:func:`tree_diff`, dtype and shape included) and every
failure names its SPEC clause and where it happened (rank, world sizes, family, format).
:func:`check_refusal` judges an error case recorded on a rank (raised what, and whether the
files on disk stayed as they were: :func:`suites.lib.shared.files.files_digest` before and
after). :func:`standard_form` is the suite's own conversion of name-keyed optimizer state to
torch's integer form. :func:`convert_offline` is the one place the suites call reference
code: the offline converter (an offline tool, not the strategy under test; CKPT-RT-4).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from suites.lib.controller.session_twin import Twin, assert_matches
from suites.lib.controller.tolerances import tolerance
from suites.lib.shared.checkpoint_specs import make_metadata, plain_metadata
from suites.lib.shared.lr_schedules import SCHEDULER_KEY, WARMUP_STEPS, scheduler_difference
from suites.lib.shared.models import build_model
from suites.lib.shared.session_ops import Step

if TYPE_CHECKING:
    from suites.lib.shared.checkpoint_specs import CkptPlan

__all__ = [
    "as_dtype",
    "assert_loaded_equals_saved",
    "assert_same_model",
    "assert_same_optim",
    "assert_unstepped",
    "check_moments",
    "check_on_disk",
    "check_refusal",
    "check_round_trip",
    "check_scheduler",
    "convert_offline",
    "standard_form",
    "tree_diff",
]


def assert_loaded_equals_saved(
    plan: CkptPlan, saved: list[dict], loaded: list[dict], *, clause: str, what: str = ""
) -> None:
    """Every loading rank holds bitwise what rank 0 of the saving job read, and got all
    the metadata back (none was requested)."""
    expected = saved[0]
    meta = plain_metadata(make_metadata(plan.meta))
    for rank, out in enumerate(loaded):
        where = f"load rank {rank}, {plan.worlds}{what}"
        if out["world_size"] != plan.load.world_size:
            raise AssertionError(f"{where}: the job ran at world size {out['world_size']}")
        assert_same_model(out["model"], expected["model"], clause=clause, where=where)
        assert_same_optim(out["optim"], expected["optim"], clause=clause, where=where)
        found = tree_diff(out["returned"], meta, "returned metadata")
        if found:
            raise AssertionError(f"CKPT-LOAD-2: {where}: {found}")


def tree_diff(actual: Any, expected: Any, path: str = "") -> str | None:
    """The first difference between two nested values (tensors bitwise, dtype included)."""
    if isinstance(expected, Tensor) or isinstance(actual, Tensor):
        if not (isinstance(actual, Tensor) and isinstance(expected, Tensor)):
            return f"{path}: {type(actual).__name__} where {type(expected).__name__} was saved"
        if actual.dtype != expected.dtype or actual.shape != expected.shape:
            return (
                f"{path}: {actual.dtype}{tuple(actual.shape)} where "
                f"{expected.dtype}{tuple(expected.shape)} was saved"
            )
        if not torch.equal(actual.cpu(), expected.cpu()):
            bad = int((actual.cpu() != expected.cpu()).sum())
            return f"{path}: {bad} of {expected.numel()} elements differ from what was saved"
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            keys = set(actual) if isinstance(actual, dict) else type(actual).__name__
            return f"{path}: keys {_keys(keys)} where {_keys(set(expected))} were saved"
        for key in sorted(expected, key=str):
            found = tree_diff(actual[key], expected[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{path}: {actual!r} where {expected!r} was saved"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            found = tree_diff(a, e, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if actual == expected else f"{path}: {actual!r} where {expected!r} was saved"


def _keys(keys: Any) -> str:
    return str(sorted(keys, key=str)) if isinstance(keys, set) else str(keys)


def assert_same_model(actual: dict, expected: dict, *, clause: str, where: str) -> None:
    """Bitwise equality of two gathered model state dicts; the message names the clause."""
    found = tree_diff(actual, expected, "model")
    if found:
        raise AssertionError(f"{clause}: {where}: {found}")


def as_dtype(tree: Any, dtype: torch.dtype, key: str = "") -> Any:
    """``tree`` (a state dict, nested) with its floating-point tensors in ``dtype``, as a load
    into objects of that dtype gives them (torch's optimizer keeps ``step`` as it is)."""
    if isinstance(tree, dict):
        return {k: as_dtype(v, dtype, str(k)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [as_dtype(v, dtype, key) for v in tree]
    if isinstance(tree, torch.Tensor) and tree.is_floating_point() and key != "step":
        return tree.to(dtype)
    return tree


def _sorted_groups(osd: dict) -> dict:
    groups = [{**g, "params": sorted(g.get("params", []))} for g in osd.get("param_groups", [])]
    return {"state": osd.get("state", {}), "param_groups": groups}


def assert_same_optim(actual: dict, expected: dict, *, clause: str, where: str) -> None:
    """Bitwise equality of two gathered (name-keyed) optimizer state dicts, hyper-parameters
    of every group included; the message names the clause."""
    found = tree_diff(_sorted_groups(actual), _sorted_groups(expected), "optimizer")
    if found:
        raise AssertionError(f"{clause}: {where}: {found}")


def assert_unstepped(osd: dict, *, clause: str, where: str) -> None:
    """An optimizer saved before its first step, or loaded from such a checkpoint, holds no
    state, as the plain optimizer (a save that steps it to create state, as torch's reader
    does, advances Adam's step count: the first real step is then a second one)."""
    state = {k: v for k, v in osd.get("state", {}).items() if v}
    if state:
        name, first = next(iter(sorted(state.items(), key=lambda kv: str(kv[0]))))
        step = first.get("step") if isinstance(first, dict) else None
        raise AssertionError(
            f"{clause}: {where}: saved before the first optimizer step, the optimizer holds "
            f"state for {sorted(state, key=str)} ({name!r}: {sorted(first)}"
            + (f", step {float(step):g}" if step is not None else "")
            + "); the plain optimizer holds none until it steps, and loading its checkpoint "
            "gives none"
        )


def check_refusal(
    record: dict, expected: tuple[str, ...], clause: str, what: str, words: tuple[str, ...] = ()
) -> None:
    """The controller's verdict on one :func:`attempt` record: raised one of ``expected``
    (an ``Exception``), the message mentions every one of ``words``, the files unchanged."""
    problem = None
    if record["type"] is None:
        problem = "nothing was raised"
    elif not record["is_exception"]:
        problem = (
            f"raised {record['type']}, which is not an Exception (torch's "
            "CheckpointException must reach the caller as RuntimeError)"
        )
    elif not set(expected) & set(record["mro"]):
        problem = (
            f"raised {record['type']}({record['message']!r}); expected {' or '.join(expected)}"
        )
    else:
        missing = [w for w in words if w.lower() not in record["message"].lower()]
        if missing:
            problem = f"the message {record['message']!r} does not mention {missing}"
        elif not record["unchanged"]:
            problem = "the files on disk changed"
    if problem:
        raise AssertionError(f"{clause}: {what}: {problem}")


def standard_form(named: dict, order: list[list[str]] | None = None) -> dict:
    """The suite's own conversion of a name-keyed optimizer state dict to torch's integer
    form: ids ``0..n-1`` in ``param_groups`` order (``order``: the names of each group)."""
    order = order or [list(g["params"]) for g in named["param_groups"]]
    ids = {name: i for i, name in enumerate(n for group in order for n in group)}
    groups = [
        {**g, "params": [ids[n] for n in names]}
        for g, names in zip(named["param_groups"], order, strict=True)
    ]
    return {"state": {ids[n]: v for n, v in named["state"].items()}, "param_groups": groups}


def convert_offline(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Convert a sharded checkpoint to a full one with the reference's offline converter.

    The only reference code the suites call: the converter is an offline tool (no process
    group), not part of the strategy under test (CKPT-RT-4).
    """
    from reference_impl.checkpoint import convert_sharded_to_full

    convert_sharded_to_full(src, dst)


def check_on_disk(plan: CkptPlan, path: str) -> None:
    """MP-3 / ``state_dict_type``: the format on disk is the one asked for; a full file
    holds the plain model's keys (CKPT-BUF-1) and stateful metadata as a dict (CKPT-SAVE-4)."""
    option = (
        "save_distributed_checkpoint" if plan.save.family == "model_parallel" else "state_dict_type"
    )
    where = f"MP-3: {plan.save.family} with {option} for the {plan.fmt} format"
    if plan.fmt == "sharded":
        assert Path(path).is_dir() and (Path(path) / ".metadata").is_file(), (
            f"{where}: {path} is not a torch.distributed.checkpoint directory"
        )
        assert (Path(path) / "meta.pt").is_file(), f"{where}: no meta.pt in {path}"
        return
    assert Path(path).is_file(), f"{where}: {path} is not one file"
    content = torch.load(path, weights_only=True)  # CKPT-SEC-1: readable without pickling code
    plain = build_model(plan.save.model, "meta").state_dict()
    assert set(content["model"]) == set(plain), (
        f"CKPT-BUF-1: the full file's model keys {sorted(content['model'])} differ from the "
        f"plain model's state_dict keys {sorted(plain)}"
    )
    for key in ("counter", SCHEDULER_KEY):
        if key in content:
            assert isinstance(content[key], dict), (
                f"CKPT-SAVE-4: the full file holds a {type(content[key]).__name__} under "
                f"{key!r}; an object with state_dict() must be saved as its state dict"
            )


#: the scheduler of the checks, in messages
SCHEDULER = f"the learning-rate scheduler (torch's LambdaLR, {WARMUP_STEPS}-step linear warmup)"


def check_scheduler(scheduler: dict[str, Any], *, where: str) -> None:
    """CKPT-SAVE-4 on the scheduler a round trip saves and asks back (``out["scheduler"]``
    of :func:`~suites.lib.ranks.checkpoint_jobs.round_trip_rank`): the caller's own object
    is still in ``state`` and holds the saved ``state_dict()`` and ``get_last_lr()``."""
    replaced = scheduler["replaced_by"]
    if replaced is not None:
        raise AssertionError(
            f"CKPT-SAVE-4: {where}: {SCHEDULER} passed in state[{SCHEDULER_KEY!r}] was "
            f"replaced by a {replaced}; an object with load_state_dict() is restored in place "
            "through it (CKPT-LOAD-2), so the caller's scheduler goes on from the saved state"
        )
    found = scheduler_difference(scheduler["loaded"], scheduler["saved"])
    if found:
        raise AssertionError(
            f"CKPT-SAVE-4: {where}: after the load, {SCHEDULER} holds {found}; its "
            "load_state_dict() was not given the saved state (a resumed run would restart "
            "its warmup)"
        )


def check_round_trip(plan: CkptPlan, out: dict[str, Any], rank: int) -> None:
    """Every comparison of one rank's :func:`~suites.lib.ranks.checkpoint_jobs.round_trip_rank`,
    each failure naming its clause."""
    where = f"rank {rank}, {plan.worlds}"
    clause = "CKPT-RT-1" if plan.fmt == "full" else "CKPT-RT-2"
    saved, loaded = out["saved"], out["loaded"]
    plain = build_model(plan.save.model, "meta")
    assert set(saved["model"]) == set(plain.state_dict()), (
        f"CKPT-BUF-1: {where}: the gathered state holds {sorted(saved['model'])}; the plain "
        f"model's state_dict (persistent buffers, no non-persistent ones) is "
        f"{sorted(plain.state_dict())}"
    )
    if plan.save.plan.steps == 0:
        assert_unstepped(saved["optim"], clause=clause, where=f"{where}, after the save")
        assert_unstepped(loaded["optim"], clause=clause, where=f"{where}, loaded")
    assert_same_model(loaded["model"], saved["model"], clause=clause, where=where)
    assert_same_optim(loaded["optim"], saved["optim"], clause=clause, where=where)
    frozen = set(plan.save.model.frozen)
    stateful = set(loaded["optim"].get("state", {}))
    assert not frozen & stateful, (
        f"CKPT-STRICT-3: {where}: frozen parameters {sorted(frozen & stateful)} got state"
    )
    if plan.save.model.tied:
        assert not {"embed.weight", "head.weight"} <= stateful, (
            f"CKPT-STRICT-3: {where}: the tied weight has state under both of its names"
        )
    # a requested key in the return value was ignored, not restored (the return value is
    # the metadata nobody asked for): said before the scheduler's own check, which a load
    # that ignores every request would otherwise fail first
    ignored = sorted(k for k in (*plan.requested, SCHEDULER_KEY) if k in out["returned"])
    assert not ignored, (
        f"CKPT-LOAD-2: {where}: requested metadata {ignored} came back in the return value "
        "instead of being restored into state in place"
    )
    check_scheduler(out["scheduler"], where=where)
    expected_meta = plain_metadata(make_metadata(plan.meta))
    for key in plan.requested:
        found = tree_diff(out["restored"][key], expected_meta[key], f"state[{key!r}]")
        assert found is None, f"CKPT-LOAD-2: {where}: requested metadata not restored: {found}"
    assert out["same_counter"], (
        f"CKPT-SAVE-4: {where}: the stateful object was replaced, not loaded in place"
    )
    for key in set(expected_meta) - set(plan.requested):
        assert key in out["returned"], (
            f"CKPT-LOAD-2: {where}: metadata {key!r} was not requested and is not returned "
            f"(returned: {sorted(out['returned'])})"
        )
        found = tree_diff(out["returned"][key], expected_meta[key], f"returned[{key!r}]")
        assert found is None, f"CKPT-LOAD-2: {where}: {found}"
    fresh = dict(build_model(plan.load.model).named_buffers())
    for name, value in out["volatile"].items():
        # compared at the buffer's own dtype: under a *-true precision it was created low
        assert torch.equal(value, fresh[name].to(value.dtype)), (
            f"CKPT-BUF-1: {where}: non-persistent buffer {name!r} changed on load: "
            f"{value.tolist()} where the fresh model holds {fresh[name].tolist()}"
        )
    before, after = out["after_step"]
    found = tree_diff(after, before, "model after one more step")
    assert found is None, (
        f"CKPT-STRICT-3: {where}: one step after the load differs from one step without "
        f"stopping (optimizer state incomplete?): {found}"
    )


def check_moments(plan: CkptPlan, outs: list[dict[str, Any]]) -> None:
    """Every comparison of :func:`~suites.lib.ranks.checkpoint_moment_jobs.moments_rank`,
    each failure naming the round trip's clause, the rank and the moment.

    - Before the first step: the save leaves the optimizer without state, and fresh objects
      loading it hold none either (as the plain optimizer), the saved model and the saved
      groups' hyper-parameters; one step from there is step 1 of the live run, bitwise.
    - The live run (saved at each moment) is the plain twin's, step counts exactly and the
      values within the precision's tolerance, after steps 1 and 2: a save neither stepped
      the optimizer nor lost the gradients accumulated before it.
    - A second save of the same objects after more training loads as that save, not the
      first; the save between the micro-batches of step 2 loads as the state before step 2,
      and step 2 from there is the live step 2, bitwise.
    - The save after step 1, loaded into fresh objects whose optimizer never stepped while
      their parameters hold gradients (a forward and a backward before the load): the
      optimizer holds the saved state right after the load, model and state are the save's,
      and step 2 from there is the live step 2, bitwise.
    """
    clause = "CKPT-RT-1" if plan.fmt == "full" else "CKPT-RT-2"
    s = plan.save
    twin = Twin(s, ())
    twin.step(Step(0, 1, None), s.dp_size)
    one = twin.expected()
    twin.step(Step(1, 2, None), s.dp_size)
    two = twin.expected()
    tol = tolerance(s.precision, s.optim.kind, lr=s.optim.max_lr, steps=2)
    for rank, out in enumerate(outs):
        where = f"rank {rank}, {s.family} {plan.fmt} at world size {s.world_size}"
        zero, loaded = out["zero"], out["zero_loaded"]
        before = f"{where}, saved before the first optimizer step"
        assert zero["empty"], (
            f"{clause}: {before}: after the save the optimizer holds state; it had none and "
            "a save must not create it (a step to initialize it advances Adam's step count)"
        )
        assert loaded["empty"], (
            f"{clause}: {before}, loaded into fresh objects: their optimizer holds state; "
            "the plain optimizer loading a checkpoint of one that never stepped holds none"
        )
        assert_same_model(loaded["model"], zero["model"], clause=clause, where=before)
        found = tree_diff(loaded["groups"], zero["groups"], "param_groups")
        assert found is None, f"{clause}: {before}: the groups' hyper-parameters: {found}"
        for label, read, expected in (
            ("after step 1", out["one"], one),
            ("after step 2", out["two"], two),
        ):
            what = f"{where}, the live run saved at every moment, {label}"
            try:
                assert_matches(read, expected, tol, what=what)
            except AssertionError as exc:
                raise AssertionError(f"{clause}: {str(exc).removeprefix('TRAIN-4: ')}") from None
        for label, got, expected in (
            ("loaded from before the first step, then step 1", loaded["then"], out["one"]),
            ("loaded from the second save (after step 1)", out["second_loaded"], out["one"]),
            ("loaded from the save between step 2's micro-batches", out["mid_loaded"], out["one"]),
            (
                "loaded from the save inside step 2, then step 2",
                out["mid_loaded"]["then"],
                out["two"],
            ),
        ):
            what = f"{where}, {label}, against the live run"
            assert_same_model(got["model"], expected["model"], clause=clause, where=what)
            assert_same_optim(got["optim"], expected["optim"], clause=clause, where=what)
        _check_pending_load(clause, where, out)


def _check_pending_load(clause: str, where: str, out: dict[str, Any]) -> None:
    """The load into a never-stepped optimizer whose parameters hold gradients
    (:func:`check_moments`)."""
    pending = out["pending_loaded"]
    what = (
        f"{where}, the save after step 1 loaded into fresh objects that ran a forward and a "
        "backward first (optimizer never stepped, gradients held)"
    )
    assert not (pending["empty"] and out["one"]["optim"]["state"]), (
        f"{clause}: {what}: right after the load the optimizer holds no state, though the "
        "checkpoint holds it: the load dropped it (torch's set_optimizer_state_dict and "
        "get_optimizer_state_dict skip initializing a never-stepped optimizer's state when "
        "its parameters hold gradients; initialize it with those gradients set aside, never "
        "by a step that uses them)"
    )
    for label, got, expected in (
        ("after the load", pending, out["one"]),
        ("after the load, then step 2", pending["then"], out["two"]),
    ):
        assert_same_model(got["model"], expected["model"], clause=clause, where=f"{what}, {label}")
        assert_same_optim(got["optim"], expected["optim"], clause=clause, where=f"{what}, {label}")
