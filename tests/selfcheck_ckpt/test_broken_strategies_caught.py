"""Issue 6 self-check: each broken strategy fails the checkpoint suites on its clause.

Each inner run selects only the checks of the clause the strategy breaks (``--clauses``),
stops at the first failure (``-x``) and does not shrink (Hypothesis profile ``selfcheck``).
It must fail, and the conformance summary must list the clause as ``failed`` with a failure
whose text names the clause.
"""

from __future__ import annotations

import re

import pytest

from selfcheck_ckpt.run_suites import assert_clause_fails, run_suites

#: factory in selfcheck_ckpt.broken -> the clause it breaks
BROKEN = {
    "local_shard_optimizer": "CKPT-RT-3",
    "ignores_metadata": "CKPT-LOAD-2",
    "strict_false_raises_on_missing_keys": "CKPT-STRICT-2",
    "rekeys_in_parameters_order": "CKPT-REKEY-1",
    "skips_optimizer_in_full_format": "CKPT-RT-1",
    "drops_saved_metadata": "CKPT-SAVE-7",
    "deletes_old_checkpoint_first": "CKPT-SAVE-6",
}


@pytest.mark.parametrize("factory", sorted(BROKEN))
def test_broken_strategy_is_caught_on_its_clause(factory: str) -> None:
    assert_clause_fails(f"selfcheck_ckpt.broken:{factory}", BROKEN[factory])


#: the checks that carry a learning-rate scheduler in their metadata (CKPT-SAVE-4), each
#: with what its failure says of a scheduler a load left as it was
SCHEDULER_CHECKS = {
    "suites/test_checkpoint_resume.py": "resumed from .* into a fresh warmup scheduler",
    "suites/test_checkpoint_roundtrip.py": "after the load, the learning-rate scheduler",
}


def test_scheduler_left_as_it_was_is_caught() -> None:
    """``skips_stateful_metadata`` saves the scheduler but never restores it (a resumed run
    restarts its warmup): the resume check and the round trip each fail CKPT-SAVE-4 saying
    what the scheduler holds after the load and what was saved (one inner run, stopping at
    the second failure)."""
    args = [
        "--strategy",
        "selfcheck_ckpt.broken:skips_stateful_metadata",
        "--clauses",
        "CKPT-SAVE-4",
        "--maxfail=2",
        "--nproc",
        "4",
        "--hypothesis-profile=selfcheck",
        "-q",
    ]
    result = run_suites(args, timeout=170, suites=sorted(SCHEDULER_CHECKS))
    output = result.stdout + result.stderr
    tail = output[-4000:]
    assert result.returncode == 1, f"the suites did not fail (rc={result.returncode})\n{tail}"
    line = re.search(r"^\s+CKPT-SAVE-4\s+(\S+)\s", output, re.MULTILINE)
    status = line.group(1) if line else "missing"
    assert status == "failed", f"CKPT-SAVE-4 is {status}, not failed\n{tail}"
    for suite, what in SCHEDULER_CHECKS.items():
        told = re.search(
            rf"AssertionError: CKPT-SAVE-4: .*{what}.* holds last_lr \[.+\] "
            r"\(last_epoch \d+\) where \[.+\] \(last_epoch \d+\) was saved",
            output,
        )
        assert told is not None, f"{suite}: no failure saying found vs saved\n{tail}"
