"""Every supported pair of configuration values, by construction: training and round trips.

The Hypothesis checks draw their configurations; this module runs a fixed pairwise covering
set of them instead (:mod:`suites.lib.controller.covering`): every pair of values on two
main axes (family, sharding layout, precision, wrap kind, world size, checkpoint format,
model kinds) that a valid configuration takes is taken by at least one row, so the ``ci``
profile exercises each of them whatever Hypothesis draws elsewhere. Each row is one check
and one rank job (the round trip of ``test_checkpoint_roundtrip``, with its training and
the state before the save kept) that touches several clauses, so each of them reaches every
value too:

- train two steps of two micro-batches, the first under ``no_backward_sync``, clipped, and
  compare clip norms (CLIP-1), then losses and parameters (TRAIN-1, SYNC-1) with the
  unsharded model; every rank gathers the same parameters (SHARD-2); the trained parameters
  and the optimizer state have the precision's stored dtype (PREC-1, PREC-2 and PREC-3, each
  on the rows of its precisions: the stored half of those clauses, their compute dtypes are
  ``test_precision``'s);
- save in the row's format with user metadata; the gathered model and optimizer state read
  before and after the save are bitwise equal (CKPT-SAVE-7);
- load into fresh objects of the same configuration (another init and learning rate) and
  compare what the two read back, bitwise (CKPT-RT-1 for full checkpoints, CKPT-RT-2 for
  sharded), the format on disk (MP-3 for the model-parallel family), the keys and buffers
  (CKPT-BUF-1), the metadata, a learning-rate scheduler among it (CKPT-LOAD-2,
  CKPT-SAVE-4), then one more step with both: the same parameters (CKPT-STRICT-3: the loaded
  optimizer state is complete; CKPT-RT-5: two steps, a save, a load into new objects and one
  more step end bitwise where three steps without stopping end).
"""

from __future__ import annotations

import tempfile

import pytest
import torch

from harness.run.session import current
from suites.lib.controller.checkpoint_checks import (
    assert_same_model,
    assert_same_optim,
    check_on_disk,
    check_round_trip,
    tree_diff,
)
from suites.lib.controller.clause_covers import round_trip_plan
from suites.lib.controller.covering import CoverRow, cover_rows, universe
from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import (
    assert_clipped,
    assert_close,
    assert_parity,
    expected_dtypes,
    reference_run,
    scenario_tolerance,
)
from suites.lib.controller.scenarios import available_world_sizes
from suites.lib.controller.written import check_written, judged_if_it_fails
from suites.lib.ranks.checkpoint_jobs import path_for, round_trip_rank
from suites.lib.ranks.training import RankResult
from suites.lib.shared.specs import Scenario

WORLDS = tuple(available_world_sizes())
COMMON = (
    "TRAIN-1",
    "SYNC-1",
    "CLIP-1",
    "SHARD-2",
    "CKPT-SAVE-7",
    "CKPT-STRICT-3",
    "CKPT-RT-5",
)
#: the precision clause of each precision (the stored dtypes of parameters and state)
PRECISION_CLAUSE = {
    "32-true": "PREC-1",
    "bf16-mixed": "PREC-2",
    "16-mixed": "PREC-2",
    "bf16-true": "PREC-3",
    "16-true": "PREC-3",
}
ROUND_TRIP = ("CKPT-BUF-1", "CKPT-LOAD-2", "CKPT-SAVE-4")


def _clauses(row: CoverRow) -> tuple[str, ...]:
    own: tuple[str, ...] = ("CKPT-RT-1",) if row.fmt == "full" else ("CKPT-RT-2",)
    if row.scenario.family == "model_parallel":
        own += ("MP-3",)
    return (*COMMON, PRECISION_CLAUSE[row.scenario.precision], *own, *ROUND_TRIP)


ROWS = [
    pytest.param(row, id=row.id, marks=pytest.mark.clause(*_clauses(row)))
    for row in cover_rows(WORLDS)
]


def _assert_trains_like_the_plain_model(results: list[RankResult], scenario: Scenario) -> None:
    """The clip's scaling and norms (CLIP-1), then losses and parameters (TRAIN-1), each
    failure naming its clause (a wrong clip also changes what follows: it is reported as
    CLIP-1's)."""
    assert_clipped(results, scenario, clause_id="CLIP-1")
    ref = reference_run(scenario)
    tol = scenario_tolerance(scenario)
    for r in results:
        name = f"CLIP-1: rank {r.rank}: clip norms"
        assert_close(torch.tensor(r.norms), torch.tensor(ref.norms), tol, name=name)
    try:
        assert_parity(results, scenario, ref)
    except AssertionError as exc:
        raise AssertionError(f"TRAIN-1: {exc}") from None


def _assert_same_everywhere_and_stored_right(outs: list[dict], row: CoverRow) -> None:
    """SHARD-2 across the ranks' trained parameters; PREC-1/2/3 on their stored dtypes."""
    first = outs[0]["trained"].state
    for rank, out in enumerate(outs[1:], start=1):
        found = tree_diff(out["trained"].state, first, f"rank {rank}'s gathered parameters")
        assert found is None, f"SHARD-2: {row.id}: rank {rank} and rank 0 differ: {found}"
    precision = row.scenario.precision
    stored = str(expected_dtypes(precision)["stored"])
    clause = PRECISION_CLAUSE[precision]
    for rank, out in enumerate(outs):
        got = out["dtypes"]
        assert got["params"] == [stored], (
            f"{clause}: rank {rank}, {row.id}: sharded parameters are {got['params']} under "
            f"{precision}; expected {stored}"
        )
        assert got["optim"] in ([], [stored]), (
            f"{clause}: rank {rank}, {row.id}: optimizer state is {got['optim']} under "
            f"{precision}; expected {stored}"
        )


@pytest.mark.parametrize("row", ROWS)
def test_configuration_trains_and_round_trips(
    row: CoverRow, tmp_path_factory: pytest.TempPathFactory
) -> None:
    current().note_universe(universe(WORLDS))
    plan = round_trip_plan(row)
    directory = tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())
    path = path_for(directory, row.fmt)
    # one job saves and loads: a wrong checkpoint is told as written, not as what the load met
    with judged_if_it_fails(row.fmt, [(plan.save, path)], where=plan.saved_at):
        outs = run(round_trip_rank, plan, directory, True, world_size=row.scenario.world_size)
    _assert_trains_like_the_plain_model([out["trained"] for out in outs], row.scenario)
    _assert_same_everywhere_and_stored_right(outs, row)
    for rank, out in enumerate(outs):
        where = f"rank {rank}, {row.id}: read before and after the save"
        before, saved = out["before"], out["saved"]
        assert_same_model(saved["model"], before["model"], clause="CKPT-SAVE-7", where=where)
        assert_same_optim(saved["optim"], before["optim"], clause="CKPT-SAVE-7", where=where)
    check_on_disk(plan, path)
    check_written(plan.save, row.fmt, path, where=plan.saved_at)  # before what the load read
    for rank, out in enumerate(outs):
        check_round_trip(plan, out, rank)
