"""Every supported pair of configuration values, by construction: TRAIN-1 and the round trip.

The Hypothesis checks draw their configurations; this module runs a fixed pairwise covering
set of them instead (:mod:`suites.lib.controller.covering`): every pair of values on two
main axes (family, sharding layout, precision, wrap kind, world size, checkpoint format,
model kinds) that a valid configuration takes is taken by at least one row, so the ``ci``
profile exercises each of them whatever Hypothesis draws elsewhere. Each row is one check
and one rank job that touches several clauses, so each of them reaches every value too:

- train two steps of two micro-batches, the first under ``no_backward_sync``, clipped, and
  compare losses, clip norms and parameters with the unsharded model (TRAIN-1, SYNC-1,
  CLIP-1);
- save in the row's format; the gathered model and optimizer state read before and after the
  save are bitwise equal (CKPT-SAVE-7);
- load into fresh objects of the same configuration (another init) and compare what the two
  read back, bitwise (CKPT-RT-1 for full checkpoints, CKPT-RT-2 for sharded);
- take one more step with both: the same parameters, bitwise (CKPT-STRICT-3: the optimizer
  state loaded is complete).
"""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Any

import pytest
import torch

from harness.session import current
from suites.lib.controller.checkpoint_checks import assert_same_model, assert_same_optim, tree_diff
from suites.lib.controller.covering import CoverRow, cover_rows, universe
from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import (
    assert_close,
    assert_parity,
    reference_run,
    scenario_tolerance,
)
from suites.lib.controller.scenarios import available_world_sizes
from suites.lib.ranks.checkpoint_jobs import build, copy_buffers, path_for, read_state, train_plan
from suites.lib.ranks.readers import gathered_state
from suites.lib.ranks.training import RankResult, end
from suites.lib.shared.models import build_model
from suites.lib.shared.specs import Scenario

WORLDS = tuple(available_world_sizes())


def _round_trip_clause(row: CoverRow) -> str:
    return "CKPT-RT-1" if row.fmt == "full" else "CKPT-RT-2"


def _clauses(row: CoverRow) -> tuple[str, ...]:
    return ("TRAIN-1", "SYNC-1", "CLIP-1", _round_trip_clause(row), "CKPT-SAVE-7", "CKPT-STRICT-3")


ROWS = [
    pytest.param(row, id=row.id, marks=pytest.mark.clause(*_clauses(row)))
    for row in cover_rows(WORLDS)
]


def _fresh(row: CoverRow) -> Any:
    """The loading side: the same configuration with another init (a no-op load is caught)."""
    s = row.scenario
    return dataclasses.replace(s, model=dataclasses.replace(s.model, seed=s.model.seed + 1000))


def _cover_rank(ctx: Any, row: CoverRow, directory: str) -> dict[str, Any]:
    path = path_for(directory, row.fmt)
    t = build(ctx, row.scenario, row.fmt)
    result = train_plan(t, row.scenario)
    result.rank = ctx.rank
    result.state = gathered_state(t.model)
    before = read_state(t)
    t.strategy.save_checkpoint(path, {"model": t.model, "optimizer": t.optimizer})
    saved = read_state(t)
    f = build(ctx, _fresh(row), row.fmt)
    f.strategy.load_checkpoint(path, {"model": f.model, "optimizer": f.optimizer})
    loaded = read_state(f)
    plain = build_model(row.scenario.model, "meta")
    volatile = set(dict(plain.named_buffers())) - set(plain.state_dict())
    copy_buffers(f.model, t.model, volatile)  # not saved by design: align them to step on
    train_plan(t, row.scenario, steps=1)
    train_plan(f, row.scenario, steps=1)
    after = (gathered_state(t.model), gathered_state(f.model))
    end(t.strategy)
    end(f.strategy)
    return {"trained": result, "before": before, "saved": saved, "loaded": loaded, "after": after}


def _assert_trains_like_the_plain_model(results: list[RankResult], scenario: Scenario) -> None:
    """The clip norms (CLIP-1), then losses and parameters (TRAIN-1), each failure naming
    its clause (a wrong norm also changes what follows: it is reported as CLIP-1's)."""
    ref = reference_run(scenario)
    tol = scenario_tolerance(scenario)
    for r in results:
        name = f"CLIP-1: rank {r.rank}: clip norms"
        assert_close(torch.tensor(r.norms), torch.tensor(ref.norms), tol, name=name)
    try:
        assert_parity(results, scenario, ref)
    except AssertionError as exc:
        raise AssertionError(f"TRAIN-1: {exc}") from None


@pytest.mark.parametrize("row", ROWS)
def test_configuration_trains_and_round_trips(
    row: CoverRow, tmp_path_factory: pytest.TempPathFactory
) -> None:
    session = current()
    session.note_universe(universe(WORLDS))
    directory = tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())
    outs = run(_cover_rank, row, directory, world_size=row.scenario.world_size)
    _assert_trains_like_the_plain_model([out["trained"] for out in outs], row.scenario)
    clause = _round_trip_clause(row)
    for rank, out in enumerate(outs):
        where = f"rank {rank}, {row.id}: read before and after the save"
        before, saved = out["before"], out["saved"]
        assert_same_model(saved["model"], before["model"], clause="CKPT-SAVE-7", where=where)
        assert_same_optim(saved["optim"], before["optim"], clause="CKPT-SAVE-7", where=where)
        where = f"rank {rank}, {row.id}: loaded into fresh objects of the same configuration"
        assert_same_model(out["loaded"]["model"], saved["model"], clause=clause, where=where)
        assert_same_optim(out["loaded"]["optim"], saved["optim"], clause=clause, where=where)
        found = tree_diff(out["after"][1], out["after"][0], "model after one more step")
        assert found is None, (
            f"CKPT-STRICT-3: rank {rank}, {row.id}: one step after the load differs from one "
            f"step without stopping (optimizer state incomplete?): {found}"
        )
