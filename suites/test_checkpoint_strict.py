"""CONTRACT.md CKPT-STRICT-1 and CKPT-STRICT-2 (and MP-3): strict and non-strict loading,
both formats and families.

Two models that differ by the keys of their ``Scale`` module (``scale.gate``,
``scale.scale``) and by their seed save one checkpoint each; each then loads the other's.
``strict=True`` must refuse missing and unexpected model keys and a missing requested
metadata key, naming them, with the files unchanged; ``strict=False`` must load the present
keys, keep the missing ones, ignore the unexpected ones, and still refuse an optimizer whose
parameter groups differ from the checkpoint's (``ValueError`` naming the group). Each check
also runs on the configurations of ``covering_rows`` (every value of every axis, both
families and formats), as a check of its own.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suites.lib.controller.checkpoint_checks import check_refusal, tree_diff
from suites.lib.controller.checkpoint_plans import ckpt_plans
from suites.lib.controller.clause_covers import covering_rows, round_trip_plan
from suites.lib.controller.covering import CoverRow
from suites.lib.controller.dispatch import run
from suites.lib.controller.scenarios import examples, with_scale
from suites.lib.ranks.checkpoint_jobs import attempt, build, read_state, train_plan
from suites.lib.ranks.training import end
from suites.lib.shared.checkpoint_specs import CkptPlan
from suites.lib.shared.specs import Scenario

CASES = [(f, m) for f in ("fsdp", "model_parallel") for m in ("full", "sharded")]
OTHER_GROUPS = {"one": "by_depth", "by_depth": "by_kind", "by_kind": "one"}


def _params(clause: str) -> list[Any]:
    marks = [pytest.mark.clause(clause)]
    return [
        pytest.param(
            f, m, id=f"{f}-{m}", marks=marks + ([pytest.mark.clause("MP-3")] if f != "fsdp" else [])
        )
        for f, m in CASES
    ]


def _with_scale(scenario: Scenario, scale: bool) -> Scenario:
    return dataclasses.replace(scenario, model=with_scale(scenario.model, scale))


def _two_checkpoints(ctx: Any, plan: CkptPlan, directory: str) -> tuple[Any, Any, str, str]:
    """``a`` (no Scale keys, saving seed) and ``b`` (Scale keys, fresh seed), each trained
    and saved: model, optimizer and ``{"step": 7}``."""
    a = build(ctx, _with_scale(plan.save, False), plan.fmt)
    b = build(ctx, _with_scale(plan.load, True), plan.fmt)
    paths = []
    for name, t in (("without", a), ("with", b)):
        train_plan(t, plan.save)
        path = os.path.join(directory, f"{name}.pt" if plan.fmt == "full" else name)
        t.strategy.save_checkpoint(path, {"model": t.model, "optimizer": t.optimizer, "step": 7})
        paths.append(path)
    return a, b, paths[0], paths[1]


def _strict_rank(ctx: Any, plan: CkptPlan, directory: str) -> dict[str, Any]:
    a, b, without, with_ = _two_checkpoints(ctx, plan, directory)
    out = {
        "missing": attempt(
            lambda: b.strategy.load_checkpoint(without, {"model": b.model}), directory
        ),
        "unexpected": attempt(
            lambda: a.strategy.load_checkpoint(with_, {"model": a.model}), directory
        ),
        "meta": attempt(
            lambda: a.strategy.load_checkpoint(without, {"model": a.model, "absent": 1}), directory
        ),
    }
    end(a.strategy)
    end(b.strategy)
    return out


@pytest.mark.parametrize("family,fmt", _params("CKPT-STRICT-1"))
@examples(1)
@given(data=st.data())
def test_strict_load_refuses_key_differences(
    family: str, fmt: str, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plan = data.draw(ckpt_plans(family, fmt, same_config=True, min_steps=1), label="plan")
    _check_strict(plan, tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))


@pytest.mark.clause("CKPT-STRICT-1")
@pytest.mark.parametrize("row", covering_rows("CKPT-STRICT-1"), ids=lambda row: row.id)
def test_strict_load_refuses_key_differences_across_the_space(
    row: CoverRow, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _check_strict(round_trip_plan(row), tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))


def _check_strict(plan: CkptPlan, directory: str) -> None:
    for rank, out in enumerate(run(_strict_rank, plan, directory, world_size=plan.save.world_size)):
        what = f"rank {rank}, {plan.worlds}, strict=True"
        errors = ("KeyError", "RuntimeError")
        check_refusal(
            out["missing"], errors, "CKPT-STRICT-1", f"{what}, model keys missing", ("scale.",)
        )
        check_refusal(
            out["unexpected"],
            errors,
            "CKPT-STRICT-1",
            f"{what}, unexpected model keys",
            ("scale.",),
        )
        check_refusal(
            out["meta"],
            ("KeyError",),
            "CKPT-STRICT-1",
            f"{what}, requested metadata missing",
            ("absent",),
        )


def _non_strict_rank(ctx: Any, plan: CkptPlan, directory: str) -> dict[str, Any]:
    a, b, without, with_ = _two_checkpoints(ctx, plan, directory)
    saved_a, saved_b = read_state(a)["model"], read_state(b)["model"]
    state: dict[str, Any] = {"model": b.model, "step": -1, "absent": "kept"}
    out: dict[str, Any] = {
        "saved_a": saved_a,
        "saved_b": saved_b,
        "missing": attempt(
            lambda: b.strategy.load_checkpoint(without, state, strict=False), directory
        ),
    }
    out["b"], out["step"], out["absent"] = read_state(b)["model"], state["step"], state["absent"]
    out["unexpected"] = attempt(
        lambda: a.strategy.load_checkpoint(with_, {"model": a.model}, strict=False), directory
    )
    out["a"] = read_state(a)["model"]
    other = dataclasses.replace(plan.save.optim, groups=OTHER_GROUPS[plan.save.optim.groups])
    regrouped = a.strategy.setup_optimizer(other.build(a.model.named_parameters()))
    out["groups"] = attempt(
        lambda: a.strategy.load_checkpoint(
            without, {"model": a.model, "optimizer": regrouped}, strict=False
        ),
        directory,
    )
    end(a.strategy)
    end(b.strategy)
    return out


def _scale(state: dict) -> dict:
    return {k: v for k, v in state.items() if k.startswith("scale.")}


def _rest(state: dict) -> dict:
    return {k: v for k, v in state.items() if not k.startswith("scale.")}


@pytest.mark.parametrize("family,fmt", _params("CKPT-STRICT-2"))
@examples(1)
@given(data=st.data())
def test_non_strict_load_keeps_missing_and_ignores_unexpected(
    family: str, fmt: str, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plan = data.draw(ckpt_plans(family, fmt, same_config=True, min_steps=1), label="plan")
    _check_non_strict(plan, tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))


@pytest.mark.clause("CKPT-STRICT-2")
@pytest.mark.parametrize("row", covering_rows("CKPT-STRICT-2"), ids=lambda row: row.id)
def test_non_strict_load_keeps_missing_and_ignores_unexpected_across_the_space(
    row: CoverRow, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _check_non_strict(round_trip_plan(row), tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))


def _check_non_strict(plan: CkptPlan, directory: str) -> None:
    results = run(_non_strict_rank, plan, directory, world_size=plan.save.world_size)
    for rank, out in enumerate(results):
        what = f"CKPT-STRICT-2: rank {rank}, {plan.worlds}, strict=False"
        for key in ("missing", "unexpected"):
            assert out[key]["type"] is None, (
                f"{what}: a checkpoint with {key} model keys raised {out[key]['type']}: "
                f"{out[key]['message']}"
            )
        found = tree_diff(_rest(out["b"]), _rest(out["saved_a"]), "present keys")
        assert found is None, f"{what}: the present keys did not load: {found}"
        found = tree_diff(_scale(out["b"]), _scale(out["saved_b"]), "missing keys")
        assert found is None, f"{what}: keys missing from the checkpoint changed: {found}"
        assert out["step"] == 7 and out["absent"] == "kept", (
            f"{what}: metadata: step={out['step']!r} (saved 7), absent={out['absent']!r} "
            "(not in the checkpoint: must keep 'kept')"
        )
        found = tree_diff(out["a"], _rest(out["saved_b"]), "loaded keys")
        assert found is None, f"{what}: with unexpected keys ignored, the rest must load: {found}"
        check_refusal(
            out["groups"],
            ("ValueError",),
            "CKPT-STRICT-2",
            f"rank {rank}, {plan.worlds}: optimizer with other parameter groups",
            ("group",),
        )
