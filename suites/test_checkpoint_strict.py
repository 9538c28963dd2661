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
from suites.lib.ranks.checkpoint_refusal_jobs import non_strict_rank, strict_rank
from suites.lib.shared.checkpoint_specs import CkptPlan
from suites.lib.shared.models import ModelSpec

CASES = [(f, m) for f in ("fsdp", "model_parallel", "fsdp2") for m in ("full", "sharded")]


def _params(clause: str) -> list[Any]:
    marks = [pytest.mark.clause(clause)]
    return [
        pytest.param(
            f,
            m,
            id=f"{f}-{m}",
            marks=marks + ([pytest.mark.clause("MP-3")] if f == "model_parallel" else []),
        )
        for f, m in CASES
    ]


def _models(plan: CkptPlan) -> tuple[ModelSpec, ModelSpec]:
    """The two models of the jobs: ``a`` without the ``Scale`` keys (``plan.save``'s) and
    ``b`` with them (``plan.load``'s)."""
    return with_scale(plan.save.model, False), with_scale(plan.load.model, True)


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
    models = _models(plan)
    results = run(strict_rank, plan, directory, models, world_size=plan.save.world_size)
    for rank, out in enumerate(results):
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
    models = _models(plan)
    results = run(non_strict_rank, plan, directory, models, world_size=plan.save.world_size)
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
