"""Each policy of classes read wrong (``selfcheck_classes/broken.py``) fails its own clause and
no other of the three that speak of "each instance of those classes" (the reference passes
all three: the suites' own run against it, ``ci/test.sh``).

Each case runs the wrap, checkpointing and fsdp2 suites on WRAP-1, FSDP2-1 and AC-1 together
(``selfcheck`` profile: ``ci`` without shrinking, four ranks) and reads the conformance
report: the bug's clause ``failed`` with a check whose failure says which units or
checkpointed modules differ, the two others ``passed``. Their explicit examples
(``suites/lib/controller/lookalikes.py``) put a ``Block``, a subclass of it and another
module's ``Block`` side by side, so the ``ci`` profile catches each bug by construction.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from selfcheck_ckpt.run_suites import run_suites

from selfcheck_classes.broken import BUGS

CLAUSES = ("WRAP-1", "FSDP2-1", "AC-1")
SUITES = ["suites/test_sharding.py", "suites/test_fsdp2.py"]
#: what the failure of each bug's check says: the module the policy read wrong, by class
SAYS = {
    "wraps_by_exact_type": "missing blocks.1 (suites.lib.shared.models.ScaledBlock)",
    "wraps_by_class_name": "extra blocks.2 (suites.lib.shared.lookalike.Block)",
    "checkpoints_by_class_name": "extra blocks.2 (suites.lib.shared.lookalike.Block)",
}
RUN_TIMEOUT_S = 300


def _report(strategy: str, tmp: Path) -> tuple[dict, str]:
    args = [
        *("--strategy", strategy, "--clauses", ",".join(CLAUSES)),
        *("--nproc", "4", "--hypothesis-profile=selfcheck", "-q"),
        *("--conformance-report", str(tmp / "report")),
    ]
    result = run_suites(args, timeout=RUN_TIMEOUT_S, suites=SUITES)
    tail = (result.stdout + result.stderr)[-4000:]
    assert (tmp / "report" / "report.json").is_file(), f"{strategy}: no report.json\n{tail}"
    return json.loads((tmp / "report" / "report.json").read_text()), tail


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_policy_read_wrong_fails_its_clause_and_no_other(bug: str, tmp_path: Path) -> None:
    clause = BUGS[bug]
    report, tail = _report(f"selfcheck_classes.broken:{bug}", tmp_path)
    outcomes = {c: report["clauses"].get(c) for c in CLAUSES}
    assert outcomes == {c: "failed" if c == clause else "passed" for c in CLAUSES}, (
        f"{bug}: clause outcomes {outcomes}; only {clause} may fail\n{tail}"
    )
    failed = [c for c in report["checks"] if c["outcome"] == "failed"]
    assert failed and all(c["clauses"] == [clause] for c in failed), (
        f"{bug}: failed checks {[(c['clauses'], c['failure'][:200]) for c in failed]}"
    )
    assert any(SAYS[bug] in c["failure"] for c in failed), (
        f"{bug}: no failure says {SAYS[bug]!r}: {[c['failure'][:300] for c in failed]}"
    )
