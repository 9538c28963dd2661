"""Every supported pair of configuration values, by construction: TRAIN-1 and the round trip.

The Hypothesis checks draw their configurations; this module runs a fixed pairwise covering
set of them instead (:mod:`suites.lib.controller.covering`): every pair of values on two
main axes (family, sharding layout, precision, wrap kind, world size, checkpoint format,
model kinds) that a valid configuration takes is taken by at least one row, so the ``ci``
profile exercises each of them whatever Hypothesis draws elsewhere. Each row is one check
and one rank job: train the plan and compare with the unsharded model (TRAIN-1), save in the
row's format, load into fresh objects of the same configuration (another init) and compare
what the two read back, bitwise (CKPT-RT-1 for full checkpoints, CKPT-RT-2 for sharded).
"""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Any

import pytest

from harness.session import current
from suites.lib.controller.checkpoint_checks import assert_same_model, assert_same_optim
from suites.lib.controller.covering import CoverRow, cover_rows, universe
from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import assert_parity
from suites.lib.controller.scenarios import available_world_sizes
from suites.lib.ranks.checkpoint_jobs import build, path_for, read_state, train_plan
from suites.lib.ranks.readers import gathered_state
from suites.lib.ranks.training import end

WORLDS = tuple(available_world_sizes())


def _clauses(row: CoverRow) -> tuple[str, ...]:
    return ("TRAIN-1", "CKPT-RT-1" if row.fmt == "full" else "CKPT-RT-2")


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
    t.strategy.save_checkpoint(path, {"model": t.model, "optimizer": t.optimizer})
    saved = read_state(t)
    f = build(ctx, _fresh(row), row.fmt)
    f.strategy.load_checkpoint(path, {"model": f.model, "optimizer": f.optimizer})
    loaded = read_state(f)
    end(t.strategy)
    end(f.strategy)
    return {"trained": result, "saved": saved, "loaded": loaded}


@pytest.mark.parametrize("row", ROWS)
def test_configuration_trains_and_round_trips(
    row: CoverRow, tmp_path_factory: pytest.TempPathFactory
) -> None:
    session = current()
    session.note_universe(universe(WORLDS))
    directory = tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())
    outs = run(_cover_rank, row, directory, world_size=row.scenario.world_size)
    assert_parity([out["trained"] for out in outs], row.scenario)
    clause = _clauses(row)[1]
    for rank, out in enumerate(outs):
        where = f"rank {rank}, {row.id}: loaded into fresh objects of the same configuration"
        assert_same_model(out["loaded"]["model"], out["saved"]["model"], clause=clause, where=where)
        assert_same_optim(out["loaded"]["optim"], out["saved"]["optim"], clause=clause, where=where)
