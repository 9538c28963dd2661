"""``--clauses`` and ``--conformance-report`` are checked at start-up, each refusal one line.

The fake suites run in-process without the pool plugin (see ``conftest.py``); that a refusal
comes before any rank starts is tested end to end in ``tests/harness/test_harness_plugin.py``.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness.clauses import UnknownClauseError, select
from harness.clauses.registry import closest_ids

if TYPE_CHECKING:
    from tests.conformance.conftest import Run

RunSuite = Callable[..., "Run"]

NEVER = """
import pytest

@pytest.mark.clause("CLIP-1")
def test_clip():
    raise AssertionError("this test ran")
"""


def refusal(run: Run) -> str:
    """The one line a refused run prints (``ERROR: ...``), after checking it is refused
    before collection with pytest's usage-error status."""
    assert run.ret == pytest.ExitCode.USAGE_ERROR, run.text
    lines = [line for line in run.result.stderr.lines if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ERROR: "), lines
    assert "collected" not in run.text and "this test ran" not in run.text
    return lines[0]


def test_an_unknown_clause_is_refused_before_collection(run_suite: RunSuite) -> None:
    line = refusal(run_suite(NEVER, "--clauses", "NOPE-9"))
    assert line == (
        "ERROR: --clauses: no clause matches 'NOPE-9'; see `pytest --list-clauses` for every "
        "id (such as API-1, CKPT-RT-3; globs such as CKPT-* work too)."
    )


def test_every_unknown_pattern_is_named_with_the_closest_ids(run_suite: RunSuite) -> None:
    line = refusal(run_suite(NEVER, "--clauses", "shrad-1,CLIP-1,CKTP-RT-*"))
    assert "no clause matches 'shrad-1' (closest: SHARD-1, " in line
    assert " or 'CKTP-RT-*' (closest: CKPT-RT-*, " in line
    assert "'CLIP-1'" not in line and "--list-clauses" in line


def test_closest_ids_and_the_message_of_select() -> None:
    assert closest_ids("CKPT-RT-9", ["CKPT-RT-1", "API-1"]) == ["CKPT-RT-1"]
    assert closest_ids("ckpt-rt*", ["CKPT-RT-1", "API-1"]) == ["CKPT-RT-*", "CKPT-*"]
    assert closest_ids("NOPE-9", ["CKPT-RT-1", "API-1"]) == []
    with pytest.raises(UnknownClauseError) as info:
        select("SYNC-9,API-1,XYZ-*")
    assert str(info.value).startswith("no clause matches 'SYNC-9' (closest: SYNC-1) or 'XYZ-*';")


def test_list_clauses_gives_the_same_refusal(run_suite: RunSuite) -> None:
    line = refusal(run_suite(None, "--list-clauses", "--clauses", "SHRAD-1"))
    assert "--clauses: no clause matches 'SHRAD-1' (closest: SHARD-1" in line


def test_a_matching_pattern_still_selects(run_suite: RunSuite) -> None:
    source = NEVER.replace('raise AssertionError("this test ran")', "pass")
    run = run_suite(source, "--clauses", "clip-*")
    run.result.assert_outcomes(passed=1)
    assert run.report()["selection"]["unmatched_patterns"] == []


def test_a_missing_report_directory_is_made_and_left_clean(
    run_suite: RunSuite, tmp_path: Path
) -> None:
    out = tmp_path / "a" / "b" / "report"
    source = NEVER.replace('raise AssertionError("this test ran")', "pass")
    run = run_suite(source, "--conformance-report", str(out))
    run.result.assert_outcomes(passed=1)
    written = ["report.html", "report.json", "report.md", "summary.md"]
    assert sorted(os.listdir(out)) == written  # no probe file left


@pytest.mark.parametrize("where", ["is-a-file", "under-a-file"])
def test_a_report_path_that_cannot_be_a_directory_is_refused(
    run_suite: RunSuite, tmp_path: Path, where: str
) -> None:
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" if where == "is-a-file" else tmp_path / "file" / "report"
    line = refusal(run_suite(NEVER, "--conformance-report", str(out)))
    assert line.startswith(
        f"ERROR: --conformance-report={str(out)!r}: cannot create the directory: [Errno 20] "
    )
    assert line.endswith(
        "pass a directory you can write to, e.g. --conformance-report ./conformance-report."
    )


@pytest.mark.parametrize("how", ["chmod", "refused-probe"])
def test_an_unwritable_report_directory_is_refused(
    run_suite: RunSuite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    out = tmp_path / "ro"
    out.mkdir(mode=0o500)
    if how == "chmod" and os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    if how == "refused-probe":  # what a read-only directory answers anyone but root
        mkstemp = tempfile.mkstemp

        def refuse(*args: Any, **kwargs: Any) -> tuple[int, str]:
            if kwargs.get("dir") == str(out):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            return mkstemp(*args, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", refuse)
    line = refusal(run_suite(NEVER, "--conformance-report", str(out)))
    assert line.startswith(
        f"ERROR: --conformance-report={str(out)!r}: cannot create a file in it: "
        "[Errno 13] Permission denied; pass a directory you can write to"
    )
