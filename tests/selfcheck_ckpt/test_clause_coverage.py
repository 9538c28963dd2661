"""Issue 6: every clause of SPEC.md section 5, and MP-3, is named by a checkpoint suite test.

The suites are collected in a fresh pytest process (``--collect-only``) with the self-check
plugin dumping each test's ``clause`` marks, so parametrized marks count too.
"""

from __future__ import annotations

import json
from pathlib import Path

from selfcheck_ckpt.run_suites import run_suites

#: SPEC.md section 5 (Checkpoints), in table order, and MP-3 from section 6.
CLAUSES = (
    "CKPT-SAVE-1",
    "CKPT-SAVE-2",
    "CKPT-SAVE-3",
    "CKPT-SAVE-4",
    "CKPT-SAVE-5",
    "CKPT-LOAD-1",
    "CKPT-LOAD-2",
    "CKPT-RT-1",
    "CKPT-RT-2",
    "CKPT-RT-3",
    "CKPT-RT-4",
    "CKPT-RT-5",
    "CKPT-REKEY-1",
    "CKPT-REKEY-2",
    "CKPT-TRAINER-1",
    "CKPT-STRICT-1",
    "CKPT-STRICT-2",
    "CKPT-STRICT-3",
    "CKPT-BUF-1",
    "CKPT-RT-6",
    "CKPT-SEC-1",
    "MP-3",
)


def test_every_checkpoint_clause_is_named_by_a_suite_test(tmp_path: Path) -> None:
    dump = tmp_path / "clauses.json"
    result = run_suites(
        ["--collect-only", "-q"], timeout=120, env={"SELFCHECK_CLAUSE_DUMP": str(dump)}
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    marks: dict[str, list[str]] = json.loads(dump.read_text())
    named = {clause for clauses in marks.values() for clause in clauses}
    missing = [c for c in CLAUSES if c not in named]
    assert not missing, f"no checkpoint suite test names {missing}"
    unknown = sorted(c for c in named if c.startswith("CKPT-") and c not in CLAUSES)
    assert not unknown, f"tests name clauses that SPEC.md section 5 does not have: {unknown}"
