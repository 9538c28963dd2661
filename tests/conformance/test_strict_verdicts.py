"""``--conformance-strict`` with ``--expected-failures``: pytest's counts, ``summary.md``, the
JUnit file and the exit status say the same thing.

A run whose every listed check failed as listed, and nothing else failed, conforms (exit 0);
a listed check that passes (a strict xpass) or an unlisted one that fails does not (exit 1).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import harness

if TYPE_CHECKING:
    from tests.conformance.conftest import Run

RunSuite = Callable[..., "Run"]

SUITE = """
import pytest

@pytest.mark.clause("CKPT-STRICT-1")
def test_load_strict():
    assert False, "the load accepted an unexpected key"

@pytest.mark.clause("CKPT-STRICT-1")
def test_load_missing():
    assert False, "the load accepted a missing key"

@pytest.mark.clause("CKPT-RT-1")
def test_roundtrip():
    pass
"""
LISTED = "test_fake.test_load_strict  known bug\ntest_fake.test_load_missing  known bug\n"


def _strict(run_suite: RunSuite, source: str, listed: str = LISTED) -> Run:
    return run_suite(
        source,
        "--conformance-strict",
        "--expected-failures",
        "known.txt",
        "--junitxml",
        "junit.xml",
        files={"known.txt": listed},
    )


def _junit(run: Run) -> tuple[int, list[str]]:
    """The JUnit file's failure count and the names of its failed test cases."""
    root = ET.parse(run.report_dir.parent / "junit.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    failed = [c.get("name", "") for c in suite.iter("testcase") if c.find("failure") is not None]
    return int(suite.get("failures", "0")), failed


def test_every_listed_check_failing_as_listed_conforms(run_suite: RunSuite) -> None:
    run = _strict(run_suite, SUITE)
    assert run.ret == pytest.ExitCode.OK
    run.result.assert_outcomes(passed=1, xfailed=2)
    assert "nonconforming" not in run.text
    run.result.stdout.fnmatch_lines(
        [
            "conformance-strict: every check passed, failed as the expected-failures file "
            "lists (2) or needs another environment"
        ]
    )
    assert _junit(run) == (0, [])
    summary = (run.report_dir / "summary.md").read_text()
    assert summary.startswith("## shardcheck conformance: PASSED\n")
    assert "1 of 3 checks passed; 2 xfailed" in summary
    assert run.report()["clauses"]["CKPT-STRICT-1"] == "xfailed"  # not failed: as listed


def test_a_listed_check_that_passes_fails_the_run(run_suite: RunSuite) -> None:
    fixed = SUITE.replace('assert False, "the load accepted a missing key"', "pass")
    run = _strict(run_suite, fixed)
    assert run.ret == pytest.ExitCode.TESTS_FAILED
    run.result.assert_outcomes(passed=1, xfailed=1, failed=1)
    assert run.outcomes()["test_fake.test_load_missing"] == "failed"
    failures, failed = _junit(run)
    assert (failures, failed) == (1, ["test_load_missing"])  # the failed case says it all
    summary = (run.report_dir / "summary.md").read_text()
    assert summary.startswith("## shardcheck conformance: FAILED\n")


def test_an_unlisted_failure_fails_the_run(run_suite: RunSuite) -> None:
    broken = SUITE.replace("def test_roundtrip():\n    pass", "def test_roundtrip():\n    1 / 0")
    run = _strict(run_suite, broken)
    assert run.ret == pytest.ExitCode.TESTS_FAILED
    run.result.assert_outcomes(xfailed=2, failed=1)
    failures, failed = _junit(run)
    assert (failures, failed) == (1, ["test_roundtrip"])
    assert (
        (run.report_dir / "summary.md")
        .read_text()
        .startswith("## shardcheck conformance: FAILED\n")
    )


REFUSED = """
import pytest
from harness import Unsupported

@pytest.mark.clause("CFG-6")
def test_offload_on():
    raise Unsupported("no accelerator", "cpu_offload", True)
"""


def test_a_strict_failure_no_check_shows_is_a_junit_failure(run_suite: RunSuite) -> None:
    """The strategy refused everything: no pytest check failed, but strict mode fails the
    run; the JUnit file has a failed case that says why, so CI reads the same red."""
    run = _strict(run_suite, REFUSED, listed="")
    assert run.ret == pytest.ExitCode.TESTS_FAILED
    run.result.stdout.fnmatch_lines(["*1 skipped, 1 nonconforming*"])
    failures, failed = _junit(run)
    assert (failures, failed) == (1, ["conformance-strict"])
    root = ET.parse(run.report_dir.parent / "junit.xml").getroot()
    message = next(f.get("message", "") for f in root.iter("failure"))
    assert "offered nothing to check" in message


def test_an_expected_failure_alone_conforms(run_suite: RunSuite) -> None:
    """An xfailed check ran: the strategy offered it, so it is not 'nothing to check'."""
    source = '@__import__("pytest").mark.clause("API-1")\ndef test_bad():\n    assert False\n'
    run = _strict(run_suite, source, listed="test_fake.test_bad  known\n")
    assert run.outcomes() == {"test_fake.test_bad": "xfailed"}
    assert run.ret == pytest.ExitCode.OK
    assert _junit(run) == (0, [])


def test_a_failed_check_is_counted_once_in_pytests_last_line(run_suite: RunSuite) -> None:
    """pytest already counts a failing check as failed: the strict verdict adds nothing more
    to the last line (it once read ``1 failed, 1 nonconforming`` for one check)."""
    broken = SUITE.replace("def test_roundtrip():\n    pass", "def test_roundtrip():\n    1 / 0")
    run = _strict(run_suite, broken)
    assert run.ret == pytest.ExitCode.TESTS_FAILED
    run.result.stdout.fnmatch_lines(["*conformance-strict: FAILED*", "*1 failed, 2 xfailed in*"])
    assert "nonconforming" not in run.result.stdout.lines[-1]


LATE = """
import pytest
from harness import run_on_ranks
from harness.verdicts.attribution import clause

def teardown_on_rank(ctx):
    with clause("API-8", after=True):
        raise RuntimeError("teardown left the checkpoint_io open")

@pytest.mark.clause("API-8")
def test_teardown():
    run_on_ranks(teardown_on_rank, world_size=1)
"""


def test_a_late_finding_outside_strict_mode_is_shown_as_what_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every test case passed, yet a late finding fails the run: the summary and pytest's
    last line say so, so an exit status of 1 never comes with an all-green last line."""
    repo = str(Path(harness.__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_fake=LATE)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--nproc", "1", "--conformance-report", "out", timeout=240
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*late findings fail the run: F1 (API-8) recorded after their checks' properties*",
            "*1 passed, 1 late finding in*",
        ]
    )
