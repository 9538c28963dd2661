"""CONTRACT.md CKPT-RT-1 and CKPT-RT-2, with CKPT-SAVE-4, CKPT-LOAD-2, CKPT-STRICT-3,
CKPT-BUF-1 (and MP-3): full and sharded round trips at one world size, both families.

Two jobs per example: train (0-2 steps), save model, optimizer and user metadata, read what
was saved with torch's own gathered-state APIs and take one more step; then, once the
controller has judged the checkpoint as written (:mod:`suites.lib.controller.written`: the
file or directory read as a user's tools read it, against the plain model and optimizer),
load into fresh objects (another seed and learning rate), read again, take one more step and
compare. The metadata
always holds a learning-rate scheduler over the optimizer (torch's ``LambdaLR`` with a linear
warmup, stepped as often as the optimizer: :mod:`suites.lib.shared.lr_schedules`), asked
back into a fresh one: after the load the caller's scheduler holds the saved
``state_dict()`` and ``get_last_lr()`` (CKPT-SAVE-4). Moved state is
compared bitwise; the on-disk format is checked against MP-3 / ``state_dict_type``. The job
and its comparisons live in ``suites/lib`` (the configuration cover runs them too).

The round trip holds whenever the save comes. :func:`test_round_trip_at_every_moment` saves
the same objects at each moment of the ``moment`` axis (:data:`suites.lib.shared.axes.MOMENTS`)
in one job per family (fsdp in the full format, model_parallel in the sharded one), in every
profile: before the first optimizer step (the optimizer has no state, and must have none
after the save and in fresh objects loading it; one step from there is the live run's first
step), a second save after more training (it loads as itself, not as the first save), and a
save between the micro-batches of a step (it loads as the state before that step; the live
step goes on as without it); the live run is compared with the plain twin. A drawn plan of 0
steps (``dev``, ``nightly``) saves before the first step too, and its optimizer must read
empty after the save and after the load.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.run.session import current
from harness.verdicts.checked_file import loading_checked_file
from suites.lib.controller.checkpoint_checks import check_moments, check_on_disk, check_round_trip
from suites.lib.controller.checkpoint_plans import ckpt_plans
from suites.lib.controller.dispatch import run
from suites.lib.controller.scenarios import examples
from suites.lib.controller.session_draws import covering_scenario
from suites.lib.controller.written import check_written, judged_if_it_fails
from suites.lib.ranks.checkpoint_jobs import (
    join_round_trip,
    path_for,
    round_trip_load_rank,
    round_trip_save_rank,
)
from suites.lib.ranks.checkpoint_moment_jobs import moments_rank
from suites.lib.shared.axes import MOMENTS, moment_pairs
from suites.lib.shared.checkpoint_specs import CkptPlan
from suites.lib.shared.specs import Scenario

COMMON = ("CKPT-SAVE-4", "CKPT-LOAD-2", "CKPT-STRICT-3", "CKPT-BUF-1")


def _param(family: str, fmt: str) -> Any:
    clauses: tuple[str, ...] = (("CKPT-RT-1",) if fmt == "full" else ("CKPT-RT-2",)) + COMMON
    if family == "model_parallel":
        clauses += ("MP-3",)
    return pytest.param(family, fmt, id=f"{family}-{fmt}", marks=pytest.mark.clause(*clauses))


@pytest.mark.parametrize(
    "family,fmt",
    [_param(f, m) for f in ("fsdp", "model_parallel", "fsdp2") for m in ("full", "sharded")],
)
@examples(2)
@given(data=st.data())
def test_round_trip_at_one_world_size(
    family: str, fmt: str, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plan = data.draw(ckpt_plans(family, fmt, same_config=True), label="plan")
    directory = tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())
    saving = run(round_trip_save_rank, plan, directory, world_size=plan.save.world_size)
    path = path_for(directory, fmt)
    check_on_disk(plan, path)
    # what the save wrote, before anything loads it: a wrong file fails here, telling what
    # is wrong in it, and no load's consequence of it becomes a finding of its own
    found = check_written(plan.save, fmt, path, where=plan.saved_at)
    volatile = [out["volatile"] for out in saving]
    with loading_checked_file(found):  # a load that fails on a right file says so first
        loading = run(
            round_trip_load_rank, plan, directory, volatile, world_size=plan.load.world_size
        )
    for rank, (saved, loaded) in enumerate(zip(saving, loading, strict=True)):
        check_round_trip(plan, join_round_trip(saved, loaded), rank)


def moments_plan(family: str, fmt: str) -> CkptPlan:
    """The moments' plan: the scripted session's scenario at world size 2 (fsdp
    SHARD_GRAD_OP with Block units, fp32 Adam in two groups; model_parallel tensor parallel,
    bf16-mixed AdamW with weight decay), loaded with the same options into objects of another
    seed and learning rate (a loader that does nothing is caught)."""
    save = covering_scenario(family, 2)
    load = dataclasses.replace(
        save,
        model=dataclasses.replace(save.model, seed=save.model.seed + 1000),
        optim=dataclasses.replace(save.optim, lr=save.optim.lr * 2),
    )
    # the save after step 1 is a second save and a save after a step: all four moments
    return CkptPlan(save, fmt, load, moments=MOMENTS)


def _moment_param(family: str, fmt: str) -> Any:
    clauses: tuple[str, ...] = ("CKPT-RT-1" if fmt == "full" else "CKPT-RT-2", "CKPT-STRICT-3")
    if family == "model_parallel":
        clauses += ("MP-3",)
    return pytest.param(family, fmt, id=f"{family}-{fmt}", marks=pytest.mark.clause(*clauses))


#: a job per family, in a format each: every moment meets every family and both formats (an
#: fsdp full save, a model_parallel and an fsdp2 sharded one: the gathered state of FSDP1
#: units, the DTensor shards of tensor parallelism and of fully_shard's own units, where a
#: load with gradients held loses optimizer state); each about what three plain round trips cost
MOMENT_CASES = (("fsdp", "full"), ("model_parallel", "sharded"), ("fsdp2", "sharded"))


@pytest.mark.world_size(2)
@pytest.mark.parametrize("family,fmt", [_moment_param(f, m) for f, m in MOMENT_CASES])
def test_round_trip_at_every_moment(
    family: str, fmt: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plan = moments_plan(family, fmt)
    # the moments beside the family and format this job takes (the configuration cover does
    # not report moments: a clause that does not speak of them is not asked to reach them)
    values = {"family": {family}, "checkpoint": {fmt}}
    current().note_universe(moment_pairs(plan.moments, values))
    directory = tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())
    saves = moment_saves(plan, directory)
    # one job saves at every moment and loads each save: a wrong checkpoint is told as
    # written (what the loads met, and what they read back, are its consequences)
    with judged_if_it_fails(fmt, saves, where=plan.saved_at):
        outs = run(moments_rank, plan, directory, world_size=plan.save.world_size)
    for scenario, path in saves:
        check_written(scenario, fmt, path, where=plan.saved_at)
    check_moments(plan, outs)


def moment_saves(plan: CkptPlan, directory: str) -> list[tuple[Scenario, str]]:
    """The moments' checkpoints (:func:`~suites.lib.ranks.checkpoint_moment_jobs.moments_rank`)
    with the training each holds: none before the first step; step 1 of one micro-batch after
    it, and in the save between step 2's micro-batches (the state before that step)."""
    s = plan.save
    before = dataclasses.replace(s, plan=dataclasses.replace(s.plan, steps=0))
    one = dataclasses.replace(s.plan, steps=1, micro_batches=1, clip=None)  # as the job steps
    after_one = dataclasses.replace(s, plan=one)
    return [
        (before, path_for(os.path.join(directory, "zero"), plan.fmt)),
        (after_one, path_for(os.path.join(directory, "one"), plan.fmt)),
        (after_one, path_for(os.path.join(directory, "mid"), plan.fmt)),
    ]
