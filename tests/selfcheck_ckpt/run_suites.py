"""Run the checkpoint suites in a fresh pytest process (the self-check's inner runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["REPO", "SUITES", "run_suites"]

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
