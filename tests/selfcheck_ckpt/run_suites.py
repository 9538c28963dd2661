"""Run the checkpoint suites in a fresh pytest process (the self-check's inner runs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["REPO", "SUITES", "assert_clause_fails", "run_suites"]

REPO = Path(__file__).resolve().parents[2]
SUITES = sorted(str(p.relative_to(REPO)) for p in (REPO / "suites").glob("test_checkpoint_*.py"))


def run_suites(
    args: Sequence[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    suites: Sequence[str] = SUITES,
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest SUITES ARGS`` in the repository, with this package importable.

    Args:
        args: pytest arguments after the suite files.
        timeout: seconds before the run is killed (``subprocess.TimeoutExpired``).
        env: extra environment variables.
        suites: the suite files to run (default: the checkpoint suites).
    """
    paths = [str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    environ = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    command = [
        sys.executable,
        "-m",
        "pytest",
        *suites,
        "-p",
        "tests.selfcheck.profile",
        "-p",
        "no:cacheprovider",
        *args,
    ]
    return subprocess.run(
        command, cwd=REPO, env=environ, capture_output=True, text=True, timeout=timeout, check=False
    )


def assert_clause_fails(
    strategy: str,
    clause: str,
    *,
    suites: Sequence[str] = SUITES,
    extra: Sequence[str] = (),
    words: Sequence[str] = (),
    timeout: float = 170,
) -> str:
    """Run ``suites`` against ``strategy`` (``module:factory``) for ``clause`` alone, stopping
    at the first failure, and assert that the run failed with ``clause`` reading ``failed``
    in the summary; with ``words``, that an ``AssertionError`` naming the clause says each of
    them. Prints the time to the first failure; returns the run's output.

    Args:
        strategy: the planted strategy's factory.
        clause: the clause it must fail.
        suites: the suite files to run.
        extra: more pytest arguments (``-k ...``).
        words: what the clause's assertion message must say.
        timeout: seconds before the inner run is killed.
    """
    args = ["--strategy", strategy, "--clauses", clause, "-x", "--nproc", "4"]
    args += ["--hypothesis-profile=selfcheck", "-q", *extra]
    result = run_suites(args, timeout=timeout, suites=suites)
    output = result.stdout + result.stderr
    tail = output[-4000:]
    assert result.returncode == 1, (
        f"{strategy}: the run did not fail (rc={result.returncode})\n{tail}"
    )
    line = re.search(rf"^\s+{re.escape(clause)}\s+(\S+)\s+(\S+): (.*)$", output, re.MULTILINE)
    assert line is not None, f"{strategy}: no summary line for {clause}\n{tail}"
    assert line.group(1) == "failed", f"{strategy}: {clause} is {line.group(1)}, not failed\n{tail}"
    if words:
        failure = re.search(rf"AssertionError: {re.escape(clause)}: .*", output)
        assert failure is not None, f"{strategy}: no assertion naming {clause}\n{tail}"
        for word in words:
            assert word in failure.group(0), (
                f"{strategy}: the failure does not say {word!r}\n{tail}"
            )
    first = re.search(r"first failure after [^)]*", output)
    print(f"{strategy}: {clause} failed ({first.group(0) if first else 'no timing'})")
    return output
