"""Acceptance: the real suites, on real ranks, against strategies defined in ``tests/``.

A strategy whose ``load_checkpoint`` drops the optimizer state must fail the run, naming the
clause and the scenario, and the report must record it; a strategy that refuses a family
must produce skips naming the option, counted by the report. Each run is one pytest
subprocess at ``--nproc 2`` on a few checks (``-k``), in the ``ci`` Hypothesis profile.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import harness

ROOT = Path(harness.__file__).resolve().parents[1]
CHECKPOINT_SUITE = "suites/test_checkpoint_roundtrip.py"
FACTORIES = "tests.conformance.broken_strategies"
#: both plugins by module name, whether or not their entry points are installed
PLUGINS = ["-p", "no:shardcheck", "-p", "harness.plugin"]
PLUGINS += ["-p", "no:shardcheck_conformance", "-p", "harness.conformance"]


def run_suites(out: Path, factory: str, *args: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    if not (ROOT / CHECKPOINT_SUITE).is_file():
        pytest.fail(f"{CHECKPOINT_SUITE} is missing: the acceptance runs need that suite")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable, "-m", "pytest", CHECKPOINT_SUITE, *PLUGINS, "-p", "no:cacheprovider",
        "--nproc", "2", "--hypothesis-profile=ci", "--strategy", f"{FACTORIES}:{factory}",
        "--conformance-report", str(out), "-q", *args,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420, check=False
    )
    report = json.loads((out / "report.json").read_text())
    return done, report


@pytest.mark.timeout(480)
def test_broken_strategy_fails_naming_clause_and_scenario(tmp_path: Path) -> None:
    done, report = run_suites(
        tmp_path, "drops_optimizer_state", "-k", "fsdp-full", "--clauses", "CKPT-RT-1", "-x"
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    check_id = "test_checkpoint_roundtrip.test_round_trip_at_one_world_size[fsdp-full]"
    check = next(c for c in report["checks"] if c["id"] == check_id)
    assert check["outcome"] == "failed"
    assert "CKPT-RT-1" in check["clauses"]
    assert "optimizer" in check["failure"]
    # Hypothesis says "Falsifying example" up to 6.16x and "Failing test case" after
    assert re.search("Falsifying example|Failing test case", check["failure"])
    assert "CkptPlan(" in check["failure"]
    assert f"--strategy {FACTORIES}:drops_optimizer_state" in check["reproducer"]
    assert "--reproduce-failure=" in check["reproducer"]
    assert report["clauses"]["CKPT-RT-1"] == "failed"
    summary = [line for line in done.stdout.splitlines() if line.startswith("  CKPT-RT-1 ")]
    assert summary and "failed" in summary[0] and check_id in summary[0], done.stdout[-3000:]
    assert "CkptPlan(" in done.stdout  # pytest's own failure output shows the scenario


@pytest.mark.timeout(480)
def test_refusing_strategy_gives_skips_naming_the_option(tmp_path: Path) -> None:
    done, report = run_suites(tmp_path, "fsdp_only", "-k", "model_parallel", "--conformance-strict")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert report["counts"]["unsupported"] == 3  # the parity, the layout and the moments check
    for check in report["checks"]:
        assert check["outcome"] == "unsupported", check
        assert check["failure"] == (
            "unsupported: family=model_parallel (this strategy has no tensor parallelism)"
        )
    assert (
        "conformance-strict: FAILED: the strategy declared every check it met unsupported (3)"
        in done.stdout
    )
