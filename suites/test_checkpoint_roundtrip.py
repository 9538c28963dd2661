"""SPEC.md section 5: full and sharded round trips at one world size, both families.

One job per example: train (0-2 steps), save model, optimizer and user metadata, read what
was saved with torch's own gathered-state APIs, load into fresh objects (another seed and
learning rate), read again, then take one more step with both and compare. Moved state is
compared bitwise; the on-disk format is checked against MP-3 / ``state_dict_type``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from suites.lib.controller.checkpoint_checks import assert_same_model, assert_same_optim, tree_diff
from suites.lib.controller.checkpoint_plans import ckpt_plans
from suites.lib.controller.dispatch import run
from suites.lib.controller.scenarios import examples
from suites.lib.ranks.checkpoint_jobs import (
    build,
    copy_buffers,
    nonpersistent_buffers,
    path_for,
    read_state,
    train_plan,
)
from suites.lib.ranks.training import end
from suites.lib.shared.checkpoint_specs import (
    CkptPlan,
    fresh_metadata,
    make_metadata,
    plain_metadata,
)
from suites.lib.shared.models import build_model

COMMON = ("CKPT-SAVE-4", "CKPT-LOAD-2", "CKPT-STRICT-3", "CKPT-BUF-1")


def _param(family: str, fmt: str) -> Any:
    clauses: tuple[str, ...] = (("CKPT-RT-1",) if fmt == "full" else ("CKPT-RT-2",)) + COMMON
    if family == "model_parallel":
        clauses += ("MP-3",)
    return pytest.param(family, fmt, id=f"{family}-{fmt}", marks=pytest.mark.clause(*clauses))


def _round_trip_rank(ctx: Any, plan: CkptPlan, directory: str) -> dict[str, Any]:
    path = path_for(directory, plan.fmt)
    t = build(ctx, plan.save, plan.fmt)
    train_plan(t, plan.save)
    t.strategy.save_checkpoint(
        path, {"model": t.model, "optimizer": t.optimizer, **make_metadata(plan.meta)}
    )
    saved = read_state(t)  # after the save: reading may initialize a never-stepped optimizer

    f = build(ctx, plan.load, plan.fmt)
    state: dict[str, Any] = {
        "model": f.model,
        "optimizer": f.optimizer,
        **fresh_metadata(plan.requested),
    }
    counter = state.get("counter")
    returned = f.strategy.load_checkpoint(path, state)
    loaded = read_state(f)
    plain = build_model(plan.load.model, "meta")
    volatile = set(dict(plain.named_buffers())) - set(plain.state_dict())
    out = {
        "saved": saved,
        "loaded": loaded,
        "restored": plain_metadata({k: state[k] for k in plan.requested}),
        "same_counter": counter is None or state["counter"] is counter,
        "returned": plain_metadata(dict(returned or {})),
        "volatile": nonpersistent_buffers(f.model, volatile),
    }
    copy_buffers(f.model, t.model, volatile)  # not saved by design: align them to step on
    train_plan(t, plan.save, steps=1)
    train_plan(f, plan.load, steps=1)
    out["after_step"] = (read_state(t)["model"], read_state(f)["model"])
    end(t.strategy)
    end(f.strategy)
    return out


def _check_on_disk(plan: CkptPlan, path: str) -> None:
    option = "state_dict_type" if plan.save.family == "fsdp" else "save_distributed_checkpoint"
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
    if "counter" in content:
        assert isinstance(content["counter"], dict), (
            "CKPT-SAVE-4: an object with state_dict() must be saved as its state dict, found "
            f"{type(content['counter']).__name__}"
        )


def check_round_trip(plan: CkptPlan, out: dict[str, Any], rank: int) -> None:
    """Every comparison of one rank's round trip, each failure naming its clause."""
    where = f"rank {rank}, {plan.worlds}"
    clause = "CKPT-RT-1" if plan.fmt == "full" else "CKPT-RT-2"
    saved, loaded = out["saved"], out["loaded"]
    plain = build_model(plan.save.model, "meta")
    assert set(saved["model"]) == set(plain.state_dict()), (
        f"CKPT-BUF-1: {where}: the gathered state holds {sorted(saved['model'])}; the plain "
        f"model's state_dict (persistent buffers, no non-persistent ones) is "
        f"{sorted(plain.state_dict())}"
    )
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
    fresh = build_model(plan.load.model)
    for name, value in out["volatile"].items():
        assert torch.equal(value.float(), dict(fresh.named_buffers())[name].float()), (
            f"CKPT-BUF-1: {where}: non-persistent buffer {name!r} changed on load"
        )
    before, after = out["after_step"]
    found = tree_diff(after, before, "model after one more step")
    assert found is None, (
        f"CKPT-STRICT-3: {where}: one step after the load differs from one step without "
        f"stopping (optimizer state incomplete?): {found}"
    )


@pytest.mark.parametrize(
    "family,fmt", [_param(f, m) for f in ("fsdp", "model_parallel") for m in ("full", "sharded")]
)
@examples(2)
@given(data=st.data())
def test_round_trip_at_one_world_size(
    family: str, fmt: str, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plan = data.draw(ckpt_plans(family, fmt, same_config=True), label="plan")
    directory = tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())
    results = run(_round_trip_rank, plan, directory, world_size=plan.save.world_size)
    _check_on_disk(plan, path_for(directory, fmt))
    for rank, out in enumerate(results):
        check_round_trip(plan, out, rank)
