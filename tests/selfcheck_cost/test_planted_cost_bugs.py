"""Each planted cost bug of :mod:`selfcheck_cost.costly` (right numbers, wrong cost) fails its
cost clause as one finding of kind ``cost``, whose failure says who held or moved what
against which bound."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from selfcheck_ckpt.run_suites import assert_clause_fails

#: factory -> (the clause it fails, words its failure says)
PLANTED = {
    "clips_on_full_gradients": (
        "COMM-2",
        ("clip_gradients_norm all-gathered", "norms take at most"),
    ),
    "syncs_inside_no_backward_sync": ("COMM-3", ("reduce-scattered", "inside no_backward_sync")),
    "gathers_full_state_on_every_rank": ("MEM-3", ("during a full save_checkpoint", "allows")),
    "gathers_the_state_twice": ("COMM-4", ("during a full save_checkpoint", "each tensor once")),
    "gathers_before_a_full_load": ("MEM-4", ("while a full load_checkpoint reads", "allows")),
    "gathers_before_a_sharded_save": ("COMM-5", ("a sharded save_checkpoint moved", "of state")),
    "regathers_after_the_step": ("MEM-1", ("of parameters after the step", "its share is")),
    "zero2_for_full_shard": ("COMM-1", ("units stayed gathered", "fsdp (FULL_SHARD")),
}


@pytest.mark.parametrize("factory", sorted(PLANTED))
def test_planted_cost_bug_fails_its_clause(factory: str, tmp_path: Path) -> None:
    clause, words = PLANTED[factory]
    output = assert_clause_fails(
        f"selfcheck_cost.costly:{factory}",
        clause,
        suites=["suites/test_cost.py"],
        extra=["--conformance-report", str(tmp_path)],
    )
    failure = re.search(rf"AssertionError: ({re.escape(clause)}: rank \d.*)", output)
    assert failure is not None, f"{factory}: no assertion\n{output[-3000:]}"
    for word in words:
        assert word in failure.group(1), f"{factory}: the failure does not say {word!r}"
    findings = json.loads((tmp_path / "report.json").read_text())["findings"]
    assert [(f["clauses"], f["kind"]) for f in findings] == [([clause], "cost")], findings
