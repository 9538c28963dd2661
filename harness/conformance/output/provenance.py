"""Where a run's figures came from: the command line, shardcheck's commit and the machine.

``report.json``'s ``run`` section carries these so that a published figure (see
``ci/results.py``) can always name the command, machine, torch and commit that produced it.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

__all__ = ["command", "commit", "machine", "provenance"]

#: shardcheck's checkout: the directory above the ``harness`` package.
_CHECKOUT = Path(__file__).resolve().parents[3]


def command(config: pytest.Config) -> str:
    """The run's pytest command line, as typed (``pytest`` followed by its arguments)."""
    return shlex.join(["pytest", *(str(a) for a in config.invocation_params.args)])


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=_CHECKOUT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> str | None:
    """shardcheck's git commit, with ``+dirty`` when tracked files differ from it; None when
    shardcheck is not run from a git checkout (an installed wheel)."""
    head = _git("rev-parse", "HEAD")
    if not head:
        return None
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}+dirty" if changed else head


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The CPU model, the CPUs this process may use and the architecture."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cpus": usable, "arch": platform.machine()}


def provenance(config: pytest.Config) -> dict[str, Any]:
    """``{"command", "commit", "machine"}`` for ``report.json``'s ``run`` section."""
    return {"command": command(config), "commit": commit(), "machine": machine()}
