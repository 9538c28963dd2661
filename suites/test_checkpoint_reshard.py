"""CONTRACT.md CKPT-RT-3 and CKPT-RT-4 (MP-3 on the model_parallel cases): resharding (save
at world size A, load at B) and offline conversion.

Each example runs two jobs at two world sizes on one checkpoint directory that the
controller creates: the param id (``4to2``) and every failure message name both sizes.
Saved state is read on the saving ranks with torch's own gathered-state APIs and compared
bitwise with what the loading ranks read after the load.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness.verdicts.checked_file import loading_checked_file
from suites.lib.controller.checkpoint_checks import (
    assert_loaded_equals_saved,
    assert_same_model,
    assert_same_optim,
    convert_offline,
)
from suites.lib.controller.checkpoint_plans import ckpt_plans
from suites.lib.controller.clause_covers import (
    covering_examples,
    covering_rows,
    reshard_plan,
    round_trip_plan,
)
from suites.lib.controller.covering import CoverRow
from suites.lib.controller.dispatch import run
from suites.lib.controller.regressions import SHARDED_1X2_TO_2X2
from suites.lib.controller.scenarios import examples
from suites.lib.controller.written import check_written
from suites.lib.ranks.checkpoint_jobs import load_rank, path_for, save_rank
from suites.lib.shared.checkpoint_specs import CkptPlan
from suites.lib.shared.specs import Scenario

#: (family, format, save world, load world): both families and formats, shrinking and growing
RESHARD_CASES = [
    ("fsdp", "sharded", 4, 2),
    ("fsdp", "full", 2, 4),
    ("fsdp", "sharded", 2, 3),
    ("model_parallel", "sharded", 2, 4),
    ("model_parallel", "full", 4, 2),
    ("fsdp2", "sharded", 4, 2),
    ("fsdp2", "full", 2, 3),
]


def _case(family: str, fmt: str, a: int, b: int) -> Any:
    clauses = ("CKPT-RT-3", "MP-3") if family == "model_parallel" else ("CKPT-RT-3",)
    return pytest.param(
        family,
        fmt,
        (a, b),
        id=f"{family}-{fmt}-{a}to{b}",
        marks=[pytest.mark.clause(*clauses), pytest.mark.world_size(a, b)],
    )


@pytest.mark.parametrize("family,fmt,worlds", [_case(*c) for c in RESHARD_CASES])
@examples(2)
@given(data=st.data())
def test_reshard_save_at_a_load_at_b(
    family: str,
    fmt: str,
    worlds: tuple[int, int],
    data: st.DataObject,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    plan = data.draw(ckpt_plans(family, fmt, worlds), label="plan")
    path = path_for(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()), fmt)
    saved = run(save_rank, plan, path, world_size=worlds[0])
    assert saved[0]["world_size"] == worlds[0]
    found = check_written(plan.save, fmt, path, where=plan.saved_at)  # before any load reads it
    with loading_checked_file(found):
        loaded = run(load_rank, plan, path, world_size=worlds[1])
    assert_loaded_equals_saved(plan, saved, loaded, clause="CKPT-RT-3")


@pytest.mark.clause("CKPT-RT-3")
@pytest.mark.parametrize("row", covering_rows("CKPT-RT-3"), ids=lambda row: row.id)
def test_reshard_across_the_space(row: CoverRow, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each covering configuration saved at its world size, loaded at the largest other."""
    plan = reshard_plan(row)
    if plan is None:
        pytest.skip("environment: resharding needs two world sizes; this session runs one")
    path = path_for(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()), row.fmt)
    saved = run(save_rank, plan, path, world_size=plan.save.world_size)
    found = check_written(plan.save, row.fmt, path, where=plan.saved_at)  # before any load
    with loading_checked_file(found):
        loaded = run(load_rank, plan, path, world_size=plan.load.world_size)
    assert_loaded_equals_saved(plan, saved, loaded, clause="CKPT-RT-3")


def _sharded_round_trip(scenario: Scenario) -> CkptPlan:
    """Saved and loaded at the configuration's world size: the covering configurations
    reach every value (loading at another world size is CKPT-RT-3's, whose siblings above
    cover it; the drawn plans below still reshard)."""
    return round_trip_plan(CoverRow(scenario, "sharded"))


@pytest.mark.clause("CKPT-RT-4")
@covering_examples("CKPT-RT-4", adapt=_sharded_round_trip, argname="plan", share=3)
@given(plan=ckpt_plans(fmt="sharded", reshard=True))
@example(plan=SHARDED_1X2_TO_2X2)
def test_sharded_converted_offline_loads_and_resaves_equal(
    plan: CkptPlan, tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())
    sharded, full, again = (os.path.join(directory, n) for n in ("ckpt", "full.pt", "again"))
    saved = run(save_rank, plan, sharded, world_size=plan.save.world_size)
    check_written(plan.save, "sharded", sharded, where=plan.saved_at)  # before it is converted
    convert_offline(sharded, full)  # one process, no process group
    content = torch.load(full, weights_only=True)
    where = f"the converted file, {plan.worlds}"
    assert_same_model(content["model"], saved[0]["model"], clause="CKPT-RT-4", where=where)
    loaded = run(load_rank, plan, full, again, world_size=plan.load.world_size)
    assert_loaded_equals_saved(plan, saved, loaded, clause="CKPT-RT-4", what=" (converted)")
    for rank, out in enumerate(loaded):
        where = f"load rank {rank}, full loaded then saved sharded and loaded, {plan.worlds}"
        assert_same_model(out["again"]["model"], saved[0]["model"], clause="CKPT-RT-4", where=where)
        assert_same_optim(out["again"]["optim"], saved[0]["optim"], clause="CKPT-RT-4", where=where)
