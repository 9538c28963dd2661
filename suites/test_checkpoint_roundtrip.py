"""CONTRACT.md CKPT-RT-1 and CKPT-RT-2, with CKPT-SAVE-4, CKPT-LOAD-2, CKPT-STRICT-3,
CKPT-BUF-1 (and MP-3): full and sharded round trips at one world size, both families.

One job per example: train (0-2 steps), save model, optimizer and user metadata, read what
was saved with torch's own gathered-state APIs, load into fresh objects (another seed and
learning rate), read again, then take one more step with both and compare. Moved state is
compared bitwise; the on-disk format is checked against MP-3 / ``state_dict_type``. The job
and its comparisons live in ``suites/lib`` (the configuration cover runs them too).
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suites.lib.controller.checkpoint_checks import check_on_disk, check_round_trip
from suites.lib.controller.checkpoint_plans import ckpt_plans
from suites.lib.controller.dispatch import run
from suites.lib.controller.scenarios import examples
from suites.lib.ranks.checkpoint_jobs import path_for, round_trip_rank

COMMON = ("CKPT-SAVE-4", "CKPT-LOAD-2", "CKPT-STRICT-3", "CKPT-BUF-1")


def _param(family: str, fmt: str) -> Any:
    clauses: tuple[str, ...] = (("CKPT-RT-1",) if fmt == "full" else ("CKPT-RT-2",)) + COMMON
    if family == "model_parallel":
        clauses += ("MP-3",)
    return pytest.param(family, fmt, id=f"{family}-{fmt}", marks=pytest.mark.clause(*clauses))


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
    results = run(round_trip_rank, plan, directory, world_size=plan.save.world_size)
    check_on_disk(plan, path_for(directory, fmt))
    for rank, out in enumerate(results):
        check_round_trip(plan, out, rank)
