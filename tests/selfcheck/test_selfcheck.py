"""The suites catch every deliberately broken strategy of ``tests/selfcheck/broken.py``.

Each bug runs the suites in a subprocess, only on its clause (``--clauses``) and stopping at
the first failure (``-x``), with the ``selfcheck`` Hypothesis profile (``ci`` without
shrinking). The run must fail, its output must name the clause, and the conformance report
must record the clause as failed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path

import pytest

from harness import max_world_size

from .broken import BUGS

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 540


def _plugin_args() -> list[str]:
    """``-p`` options for the shardcheck plugins unless their entry points are installed."""
    for dist in distributions(path=[str(REPO), *sys.path]):
        if any(ep.group == "pytest11" and ep.value == "harness.plugin" for ep in dist.entry_points):
            return []
    return ["-p", "harness.plugin", "-p", "harness.conformance"]


def run_suites(bug: str, clause: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run ``pytest suites/`` against ``make_<bug>`` on ``clause`` only; return the process.

    Args:
        bug: a key of :data:`tests.selfcheck.broken.BUGS`.
        clause: the clause id passed to ``--clauses``.
        tmp: a scratch directory (report, Hypothesis storage).
    """
    command = [
        sys.executable, "-m", "pytest", "suites/",
        "--strategy", f"tests.selfcheck.broken:make_{bug}",
        "--clauses", clause,
        "-x", "-q", "-p", "no:cacheprovider",
        "--nproc", str(max(2, max_world_size())),
        "-p", "tests.selfcheck.profile", "--hypothesis-profile=selfcheck",
        "--conformance-report", str(tmp / "report"),
        *_plugin_args(),
    ]  # fmt: skip
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp / "hyp")}
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize(("bug", "clause"), sorted(BUGS.items()), ids=sorted(BUGS))
def test_the_suites_catch_the_bug(bug: str, clause: str, tmp_path: Path) -> None:
    proc = run_suites(bug, clause, tmp_path)
    output = proc.stdout + proc.stderr
    story = f"pytest exited {proc.returncode}; output tail:\n{output[-6000:]}"
    assert proc.returncode == 1, f"make_{bug} was not caught on {clause} (exit 1 expected); {story}"
    assert re.search(rf"^\s*{re.escape(clause)}\s+failed\b", output, re.MULTILINE), (
        f"the conformance summary does not name {clause} as failed; {story}"
    )
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["clauses"].get(clause) == "failed", (
        f"report.json records {clause} as {report['clauses'].get(clause)!r}; {story}"
    )
    failed = [c for c in report["checks"] if clause in c["clauses"] and c["outcome"] == "failed"]
    assert failed and all(c["failure"] for c in failed), f"no failed {clause} check; {story}"
