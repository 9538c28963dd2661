"""Contract section 5, CKPT-SAVE-6: a save that fails part-way loses nothing.

Real faults, no mocks. Each example runs three jobs on the same path:

1. save an *old* checkpoint and read its gathered state;
2. train one more step and save again while one rank cannot write: its file-size limit
   (``RLIMIT_FSIZE``) drops to one byte for the duration of ``save_checkpoint``. With
   ``SIGXFSZ`` ignored its writes fail with ``EFBIG`` (*write error*: rank 0 for a full
   checkpoint, the last rank for a sharded one); with ``SIGXFSZ`` at its default action the
   kernel kills the rank in the middle of writing its shard (*rank killed*; the harness
   reports the crash and starts fresh ranks);
3. in fresh ranks, load the path into new objects.

The old checkpoint must still be there byte for byte, nothing else may be left beside it (no
partial file or directory), it must load and equal the old state, and a write error must be
reported by the save on every rank (a save that failed and returned normally loses data
silently).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import RankFailure, clause
from harness.api import current_config
from harness.clauses import CLAUSES
from harness.verdicts.checked_file import loading_checked_file
from suites.lib.controller.checkpoint_checks import assert_same_model, assert_same_optim
from suites.lib.controller.checkpoint_plans import ckpt_plans
from suites.lib.controller.clause_covers import covering_rows, round_trip_plan
from suites.lib.controller.covering import CoverRow
from suites.lib.controller.dispatch import run
from suites.lib.controller.scenarios import examples
from suites.lib.controller.written import check_written
from suites.lib.ranks.checkpoint_jobs import path_for
from suites.lib.ranks.checkpoint_save_jobs import (
    faulty_rank,
    faulty_save_rank,
    load_old_rank,
    save_old_rank,
)
from suites.lib.shared.checkpoint_specs import ROUND_TRIP, CkptPlan
from suites.lib.shared.files import files_digest

CLAUSE = "CKPT-SAVE-6"
CASES = [
    ("full", "write_error"),
    ("sharded", "write_error"),
    ("sharded", "rank_killed"),
]


def _faulty_save(plan: CkptPlan, path: str, fault: str, where: str) -> list[str]:
    """Run the faulty save; the errors each rank saw (``[]`` when a rank was killed)."""
    world = plan.save.world_size
    try:
        errors = run(faulty_save_rank, plan, path, fault, world_size=world)
    except RankFailure as failure:
        killed = failure.outcomes[faulty_rank(plan.fmt, world)]
        assert fault == "rank_killed" and killed.kind == "crashed", (
            f"{where}: the faulty save did not end as expected ({fault}):\n{failure}"
        )
        return []
    assert fault == "write_error", (
        f"{where}: rank {faulty_rank(plan.fmt, world)} was to be killed by SIGXFSZ while "
        f"writing, but every rank finished: the save wrote nothing on that rank? {errors}"
    )
    quiet = [rank for rank, error in enumerate(errors) if error == "no error"]
    assert not quiet, (
        f"{where}: the save failed to write on rank {faulty_rank(plan.fmt, world)} but "
        f"returned normally on rank(s) {quiet}: a failed save must raise on every rank "
        f"(errors seen: {errors})"
    )
    return errors


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("family", CLAUSES[CLAUSE].families)
@pytest.mark.parametrize("fmt,fault", CASES, ids=[f"{m}-{f}" for m, f in CASES])
@examples(1)
@given(data=st.data())
def test_failed_save_keeps_the_old_checkpoint(
    family: str,
    fmt: str,
    fault: str,
    data: st.DataObject,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    if fault == "rank_killed" and current_config().attach is not None:
        pytest.skip(
            "environment: killing a rank needs ranks the harness can replace; under torchrun "
            "(attach mode) a dead rank ends the run"
        )
    # a killed rank's partial write is cleaned by the ranks that survive it: two at least
    min_world = 2 if fault == "rank_killed" else None
    plan = data.draw(
        ckpt_plans(family, fmt, same_config=True, min_steps=1, min_world=min_world), label="plan"
    )
    _check_atomic(plan, fault, Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())))


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("row", covering_rows(CLAUSE), ids=lambda row: row.id)
def test_failed_save_keeps_the_old_checkpoint_across_the_space(
    row: CoverRow, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The write error of each format (the rank killed stays with the check above: each
    kill costs a fresh set of ranks)."""
    plan = round_trip_plan(row)
    _check_atomic(plan, "write_error", Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())))


def _check_atomic(plan: CkptPlan, fault: str, directory: Path) -> None:
    fmt = plan.fmt
    path = path_for(str(directory), fmt)
    where = f"{CLAUSE}: {plan.save.family} {fmt} save, {fault.replace('_', ' ')}"
    old = run(save_old_rank, plan, path, world_size=plan.save.world_size)
    right = check_written(plan.save, fmt, path, where=plan.saved_at)  # the old one, as written
    digest, listing = files_digest(path), sorted(os.listdir(directory))

    _faulty_save(plan, path, fault, where)

    left = sorted(os.listdir(directory))
    assert left == listing, f"{where}: the directory held {listing} before, {left} after"
    found = files_digest(path) if os.path.exists(path) else {}
    changed = sorted(k for k in digest.keys() | found.keys() if digest.get(k) != found.get(k))
    assert not changed, f"{where}: the old checkpoint changed on disk: {changed}"
    # The old checkpoint is bitwise what it was, so a load that does not give back what was
    # saved breaks the round trip (its save and load), not this save: blocked by that clause.
    round_trip = ROUND_TRIP[fmt]
    seen = f"{where.removeprefix(f'{CLAUSE}: ')}: the old checkpoint, unchanged on disk, loaded"
    with clause(round_trip):
        with loading_checked_file(right):  # a load that fails on it says the file was right
            loaded = run(load_old_rank, plan, path, world_size=plan.load.world_size)
        for rank, (was, now) in enumerate(zip(old, loaded, strict=True)):
            at = f"{seen} on rank {rank}"
            assert_same_model(now["model"], was["model"], clause=round_trip, where=at)
            assert_same_optim(now["optim"], was["optim"], clause=round_trip, where=at)
