"""The baseline loop as a team runs it: a run with failures, the baseline written from it, a
run gated on it, a planted bug fixed, ``diff`` of the runs, the baseline written again.

The fake suite's bugs are switched by ``bugs.txt``, so each run is a real pytest run of the
conformance plugin (``--expected-failures``, ``--conformance-strict``) and each report a real
``report.json``; no ranks are needed. The failures carry a temporary directory made for each
run, as a strategy's checkpoint paths do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import harness
from harness.conformance.outcomes.checks import load_expected_failures
from harness.report import main

if TYPE_CHECKING:
    from tests.conformance.conftest import Run

RunSuite = Callable[..., "Run"]

SUITE = """
import tempfile
from pathlib import Path

import pytest

def bug(name):
    return name in Path("bugs.txt").read_text().split()

@pytest.mark.clause("CKPT-RT-1")
def test_round_trip(tmp_path):
    saved = Path(tempfile.mkdtemp()) / "ckpt"  # a new directory each run
    assert not bug("lr"), f"CKPT-RT-1: lr 0.006 where 0.003 was saved in {saved}"

@pytest.mark.clause("CKPT-RT-1")
def test_round_trip_full():
    pass

@pytest.mark.clause("CKPT-LOAD-2")
def test_metadata(tmp_path):
    assert not bug("meta"), f"CKPT-LOAD-2: 'step' ignored, not restored from {tmp_path}/ckpt"

@pytest.mark.clause("MP-1")
def test_model_parallel():
    if bug("no_mp"):
        pytest.skip("unsupported: family=model_parallel (no tensor parallelism)")
    assert not bug("mp"), "MP-1: the mesh has 1 dimension where 2 were asked"

@pytest.mark.clause("TRAIN-1")
def test_parity():
    assert not bug("parity"), "TRAIN-1: loss 2.5 where the reference has 2.25"
"""


class Team:
    """One team's repository: its strategy's bugs, its baseline, its kept reports."""

    def __init__(self, run_suite: RunSuite, where: Path) -> None:
        self.run_suite = run_suite
        self.where = where
        self.out = where / "out"  # --conformance-report, as the job writes it each run
        self.baseline = where / "known-failures.txt"
        self.runs = 0

    def run(self, bugs: str, gated: bool = True) -> tuple[int, str, Path]:
        """Run the suite with ``bugs`` planted (gated: with the baseline, strict); the exit
        status, the terminal's text, and a copy of the report (the job's artifact)."""
        self.runs += 1
        (self.where / "bugs.txt").write_text(bugs)
        args = ["--conformance-strict"]
        if gated:
            args += ["--expected-failures", str(self.baseline)]
        run = self.run_suite(SUITE if self.runs == 1 else None, *args)
        kept = self.where / f"run{self.runs}"
        shutil.copytree(self.out, kept)
        return run.ret, run.text, kept

    def write_baseline(self) -> str:
        """``python -m harness.report baseline out -o known-failures.txt``; its text."""
        assert main(["baseline", str(self.out), "-o", str(self.baseline)]) == 0
        return self.baseline.read_text()


#: this checkout (pytester moved the working directory): the command runs its harness
ROOT = Path(harness.__file__).resolve().parent.parent


def _diff(old: Path, new: Path) -> tuple[int, str]:
    """``python -m harness.report diff OLD NEW``: its exit status and what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "harness.report", "diff", str(old), str(new)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert not done.stderr, done.stderr
    return done.returncode, done.stdout


def _entries(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_a_fix_reads_as_a_fix(run_suite: RunSuite, pytester: pytest.Pytester) -> None:
    team = Team(run_suite, pytester.path)

    # 1. the first run, without a baseline: three planted bugs fail it
    status, _, first = team.run("lr meta mp", gated=False)
    assert status == pytest.ExitCode.TESTS_FAILED
    written = team.write_baseline()
    assert _entries(written) == [
        "test_fake.test_round_trip  CKPT-RT-1: lr 0.006 where 0.003 was saved in <tmp>/ckpt",
        "test_fake.test_metadata  CKPT-LOAD-2: 'step' ignored, not restored from "
        "<tmp>/test_metadata0/ckpt",
        "test_fake.test_model_parallel  MP-1: the mesh has 1 dimension where 2 were asked",
    ]

    # 2. gated on it, the unchanged strategy is green, its listed failures are no news, and
    # the baseline written again is the same file
    status, text, second = team.run("lr meta mp")
    assert status == pytest.ExitCode.OK
    assert "new finding" not in text
    assert text.count("expected finding") == 3
    assert team.write_baseline() == written
    assert _diff(first, second)[0] == 0

    # 3. one planted bug fixed: the listed check passes, strict mode fails the run on purpose,
    # and diff calls it a fix (exit 0)
    status, text, third = team.run("lr mp")
    assert status == pytest.ExitCode.TESTS_FAILED
    assert "listed checks now pass (fixed), remove their lines: test_fake.test_metadata" in text
    code, said = _diff(second, third)
    assert code == 0, said
    assert "not worse: no check fails that did not, no finding is new" in said
    assert "fixed: 1 listed checks now pass, remove them from the baseline" in said
    assert "  test_fake.test_metadata: xfailed -> passed (listed)" in said
    assert "  CKPT-LOAD-2: xfailed -> passed" in said
    assert "worse" not in said.replace("not worse", "")

    # 4. the baseline written again drops the fixed check alone, and the job is green again
    again = team.write_baseline()
    assert _entries(again) == [e for e in _entries(written) if "test_metadata" not in e]
    assert sorted(load_expected_failures(str(team.baseline))) == [
        "test_fake.test_model_parallel",
        "test_fake.test_round_trip",
    ]
    status, _, fourth = team.run("lr mp")
    assert status == pytest.ExitCode.OK
    code, said = _diff(third, fourth)  # the fixed check passes, unlisted now: nothing new
    assert (code, said.splitlines()[-1]) == (
        0,
        "no change: every clause has the same outcome and checks.",
    )

    # 5. something got worse: a new bug, and a listed check the strategy now refuses, which
    # leaves its clause with no check that ran: diff exits 1 and says both
    status, text, fifth = team.run("lr no_mp parity")
    assert status == pytest.ExitCode.TESTS_FAILED
    assert "listed checks are unsupported or environment now (stale), remove their lines" in text
    code, said = _diff(fourth, fifth)
    assert code == 1, said
    assert "worse: 1 checks fail that did not, 1 new findings, 1 clauses no check tests now" in said
    assert "  test_fake.test_parity: passed -> failed" in said
    assert "  MP-1: no check tests it now (test_fake.test_model_parallel refused now)" in said
    assert "stale: 1 listed checks are unsupported or environment now" in said
    assert "  test_fake.test_model_parallel: xfailed -> unsupported (MP-1: no check" in said
    final = _entries(team.write_baseline())
    assert [e.split()[0] for e in final] == ["test_fake.test_round_trip", "test_fake.test_parity"]
