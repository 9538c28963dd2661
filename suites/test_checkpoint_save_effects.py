"""Contract section 5, CKPT-SAVE-7: saving a checkpoint changes nothing.

One job per example builds two identical set-ups from the same scenario, trains both the same
way, and saves only the first. Then the caller's ``state`` dict (keys, the very objects, the
metadata's values) must be as it was, the gathered model and optimizer state must be bitwise
what they were, and one more step must give bitwise what the twin that never saved gets.
Every read of gathered state is done on both twins, so torch's lazy initialization of a
never-stepped optimizer's state happens on both alike.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.clauses import CLAUSES
from suites.lib.controller.checkpoint_checks import tree_diff
from suites.lib.controller.checkpoint_plans import ckpt_plans
from suites.lib.controller.dispatch import run
from suites.lib.controller.scenarios import examples
from suites.lib.ranks.checkpoint_save_jobs import save_changes_nothing_rank
from suites.lib.shared.checkpoint_specs import CkptPlan

CLAUSE = "CKPT-SAVE-7"


def check_nothing_changed(plan: CkptPlan, out: dict[str, Any], rank: int) -> None:
    """Every comparison of one rank, each failure naming CKPT-SAVE-7 and what changed."""
    where = f"{CLAUSE}: rank {rank}, {plan.save.family} {plan.fmt} save"
    keys_before, keys_after = out["keys"]
    assert keys_after == keys_before, (
        f"{where}: the caller's state dict had keys {keys_before} before the save and "
        f"{keys_after} after it"
    )
    assert not out["replaced"], f"{where}: save_checkpoint replaced state{out['replaced']}"
    found = tree_diff(out["meta"][1], out["meta"][0], "metadata")
    assert found is None, f"{where}: the caller's metadata changed: {found}"
    assert out["flags"][1] == out["flags"][0], (
        f"{where}: the module's flags changed: {out['flags'][0]} before, {out['flags'][1]} after"
    )
    before, after = out["state"]
    for part in ("model", "optim"):
        found = tree_diff(after[part], before[part], part)
        assert found is None, f"{where}: the gathered {part} state changed: {found}"
    saved, never_saved = out["next_step"]
    for part in ("model", "optim"):
        found = tree_diff(saved[part], never_saved[part], part)
        assert found is None, (
            f"{where}: one step after the save differs from the same step of a twin that "
            f"never saved: {found}"
        )


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize(
    "family,fmt", [(f, m) for f in CLAUSES[CLAUSE].families for m in ("full", "sharded")]
)
@examples(2)
@given(data=st.data())
def test_saving_changes_nothing(
    family: str, fmt: str, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plan = data.draw(ckpt_plans(family, fmt, same_config=True), label="plan")
    directory = tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp())
    results = run(save_changes_nothing_rank, plan, directory, world_size=plan.save.world_size)
    for rank, out in enumerate(results):
        check_nothing_changed(plan, out, rank)
