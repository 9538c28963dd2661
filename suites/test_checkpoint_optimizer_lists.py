"""CONTRACT.md CKPT-TRAINER-1, CKPT-RT-2 and CKPT-RT-4 (MP-3 for model_parallel): a list of
optimizers (the trainer's ``optimizer_states``) in the sharded format, every family.

One job per example saves a model and two optimizers (the blocks / the rest, at two learning
rates) under one key as a list, in the sharded format, then loads that directory into fresh
objects: with one optimizer too few it must refuse (CKPT-TRAINER-1: ``RuntimeError`` naming
both counts, nothing on disk changed), with both it must restore each optimizer by position
(CKPT-RT-2, MP-3). The controller then converts the directory offline into one full file,
which must hold the list in the trainer's standard integer-keyed form and load into fresh
objects with the same state (CKPT-RT-4). Moved state is compared bitwise against what the
saving job read with torch's own gathered-state APIs.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from suites.lib.controller.checkpoint_checks import (
    assert_same_model,
    assert_same_optim,
    check_refusal,
    convert_offline,
    standard_form,
    tree_diff,
)
from suites.lib.controller.checkpoint_plans import ckpt_plans
from suites.lib.controller.dispatch import run
from suites.lib.controller.scenarios import examples, plain_blocks
from suites.lib.controller.written import judged_if_it_fails
from suites.lib.ranks.checkpoint_interop_jobs import LIST_KEY, full_list_rank, sharded_list_rank
from suites.lib.shared.checkpoint_specs import CkptPlan
from suites.lib.shared.specs import FSDPConfig, Scenario, WrapSpec


def _param(family: str) -> Any:
    clauses: tuple[str, ...] = ("CKPT-RT-2", "CKPT-RT-4", "CKPT-TRAINER-1")
    if family == "model_parallel":
        clauses += ("MP-3",)
    return pytest.param(family, id=family, marks=pytest.mark.clause(*clauses))


def _unit_aligned(plan: CkptPlan) -> CkptPlan:
    """Every block a ``Block`` that is its own FSDP1 unit: each flat parameter then lies in
    one of the two optimizers (blocks / the rest), as FSDP1's optimizer state needs (the
    DTensor families shard each parameter on its own: only the model is made plain)."""

    def align(scenario: Scenario) -> Scenario:
        strategy = scenario.strategy
        if isinstance(strategy, FSDPConfig):
            strategy = dataclasses.replace(strategy, wrap=WrapSpec("classes", ("Block",)))
        model = plain_blocks(scenario.model)
        return dataclasses.replace(scenario, model=model, strategy=strategy)

    return dataclasses.replace(plan, save=align(plan.save), load=align(plan.load))


def _check_loaded(out: dict[str, Any], saved: dict[str, Any], clause: str, where: str) -> None:
    assert_same_model(out["model"], saved["model"], clause=clause, where=where)
    for index, expected in enumerate(saved["optims"]):
        assert_same_optim(
            out["optims"][index], expected, clause=clause, where=f"{where}, optimizer {index}"
        )
    assert out["epoch"] == 2, f"CKPT-LOAD-2: {where}: requested 'epoch' is {out['epoch']!r}"


def _check_converted(content: dict[str, Any], saved: dict[str, Any], where: str) -> None:
    """The converted file: the model, and the list in the standard integer-keyed form."""
    assert_same_model(content["model"], saved["model"], clause="CKPT-RT-4", where=where)
    states = content.get(LIST_KEY)
    assert isinstance(states, list) and len(states) == len(saved["optims"]), (
        f"CKPT-TRAINER-1: {where}: {LIST_KEY!r} is {type(states).__name__}, not a list of "
        f"{len(saved['optims'])} optimizer states"
    )
    for index, (osd, named) in enumerate(zip(states, saved["optims"], strict=True)):
        refs = [p for g in osd["param_groups"] for p in g["params"]]
        assert refs == list(range(len(refs))), (
            f"CKPT-TRAINER-1: {where}: optimizer {index} is not in the standard form (ids "
            f"0..n-1 in param_groups order): {refs}"
        )
        expected = standard_form(named)["state"]
        found = tree_diff(osd["state"], expected, f"{LIST_KEY}[{index}]['state']")
        assert found is None, f"CKPT-RT-4: {where}: {found}"
    assert content.get("epoch") == 2, f"CKPT-RT-4: {where}: metadata 'epoch' is lost"


@pytest.mark.parametrize("family", [_param(f) for f in ("fsdp", "model_parallel", "fsdp2")])
@examples(2)
@given(data=st.data())
def test_list_of_optimizers_round_trips_sharded_and_converts(
    family: str, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plans = ckpt_plans(family, "sharded", same_config=True, min_steps=1)
    plan = data.draw(plans.map(_unit_aligned), label="plan")
    directory = tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())
    sharded, full = os.path.join(directory, "ckpt"), os.path.join(directory, "full.pt")
    # the job trains two optimizers, which the plain replay does not follow: when it fails,
    # the directory's model entries are judged as written (shapes, dtypes), not the values
    with judged_if_it_fails("sharded", [(plan.save, sharded)], where=plan.saved_at, values=False):
        results = run(sharded_list_rank, plan, sharded, world_size=plan.save.world_size)
    saved = results[0]["saved"]
    for rank, out in enumerate(results):
        where = f"rank {rank}, {plan.worlds}, {LIST_KEY} = [2 optimizers]"
        check_refusal(
            out["refused"],
            ("RuntimeError",),
            "CKPT-TRAINER-1",
            f"{where}: loading 2 saved optimizer states into 1 optimizer",
            words=("2", "1"),
        )
        assert_same_model(out["saved"]["model"], saved["model"], clause="CKPT-RT-2", where=where)
        _check_loaded(out["loaded"], saved, "CKPT-RT-2", where)
        assert out["returned"] == {}, f"CKPT-LOAD-2: {where}: returned {out['returned']!r}"

    convert_offline(sharded, full)  # one process, no process group
    content = torch.load(full, weights_only=True)
    _check_converted(content, saved, f"the converted file, {plan.worlds}")
    loaded = run(full_list_rank, plan, full, world_size=plan.load.world_size)
    for rank, out in enumerate(loaded):
        where = f"rank {rank}, {plan.worlds}, the converted full file"
        _check_loaded(out, saved, "CKPT-RT-4", where)
