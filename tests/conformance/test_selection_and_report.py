"""Check ids, ``--clauses``, ``--conformance-strict``, and the report files' layout."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from tests.conformance.conftest import PLUGIN_ARGS

if TYPE_CHECKING:
    from tests.conformance.conftest import Run

RunSuite = Callable[..., "Run"]

CLAUSED = """
import pytest

@pytest.mark.clause("CKPT-RT-1")
def test_full_roundtrip():
    pass

@pytest.mark.clause("CKPT-RT-3", "CKPT-STRICT-1")
def test_reshard():
    pass

@pytest.mark.clause("CLIP-1")
def test_clip():
    pass

def test_no_clause():
    pass
"""


@pytest.mark.parametrize(
    ("clauses", "selected"),
    [
        ("CKPT-RT-3", ["test_fake.test_reshard"]),
        ("CKPT-*", ["test_fake.test_full_roundtrip", "test_fake.test_reshard"]),
        ("clip-1, CKPT-STRICT-*", ["test_fake.test_reshard", "test_fake.test_clip"]),
    ],
    ids=["exact", "glob", "list-any-case"],
)
def test_clauses_select_checks(run_suite: RunSuite, clauses: str, selected: list[str]) -> None:
    run = run_suite(CLAUSED, "--clauses", clauses)
    deselected = 4 - len(selected)
    run.result.assert_outcomes(passed=len(selected), deselected=deselected)
    report = run.report()
    assert [c["id"] for c in report["checks"]] == selected
    assert report["selection"]["clauses"] == clauses
    assert len(report["selection"]["deselected"]) == deselected
    assert "test_fake.test_no_clause" in report["selection"]["deselected"]


def test_clause_pattern_that_matches_nothing_is_named(run_suite: RunSuite) -> None:
    run = run_suite(CLAUSED, "--clauses", "CLIP-1,SHARD-*")
    assert run.report()["selection"]["unmatched_patterns"] == ["SHARD-*"]
    run.result.stdout.fnmatch_lines(["--clauses: 'SHARD-*' matched no clause*"])


def test_empty_clause_list_is_a_usage_error(run_suite: RunSuite) -> None:
    run = run_suite(CLAUSED, "--clauses", " , ")
    assert run.ret == pytest.ExitCode.USAGE_ERROR
    assert "--clauses=' , ' names no clause" in run.result.stderr.str()


def test_keyword_deselection_is_listed_too(run_suite: RunSuite) -> None:
    run = run_suite(CLAUSED, "-k", "clip")
    assert sorted(run.report()["selection"]["deselected"]) == [
        "test_fake.test_full_roundtrip",
        "test_fake.test_no_clause",
        "test_fake.test_reshard",
    ]


NOT_GREEN = """
import pytest
from harness import Unsupported

@pytest.mark.clause("CFG-6")
def test_offload():
    raise Unsupported("no accelerator", "cpu_offload", True)

@pytest.mark.clause("CFG-3")
def test_mesh():
    pytest.skip("environment: needs 4 ranks")
"""

GREEN = """
import pytest

@pytest.mark.clause("API-1")
def test_ok():
    pass

@pytest.mark.clause("CFG-3")
def test_mesh():
    pytest.skip("environment: needs 4 ranks")
"""


def test_strict_fails_an_all_skipped_run(run_suite: RunSuite) -> None:
    lenient = run_suite(NOT_GREEN)
    assert lenient.ret == pytest.ExitCode.OK
    strict = run_suite(NOT_GREEN, "--conformance-strict")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    strict.result.stdout.fnmatch_lines(
        [
            "conformance-strict: FAILED: the strategy declared every check it met unsupported"
            " (1): it offered nothing to check",
            "*2 skipped, 1 nonconforming*",
        ]
    )


SUBSET = """
import pytest
from harness import Unsupported

@pytest.mark.clause("CFG-6")
def test_offload_off():
    pass

@pytest.mark.clause("CFG-6")
def test_offload_on():
    raise Unsupported("no accelerator", "cpu_offload", True)
"""


def test_strict_passes_a_strategy_that_offers_part_of_the_space(run_suite: RunSuite) -> None:
    run = run_suite(SUBSET, "--conformance-strict")
    assert run.ret == pytest.ExitCode.OK
    run.result.stdout.fnmatch_lines(
        [
            "  CFG-6 * passed * declared unsupported: cpu_offload=True",
            "declared unsupported by the strategy: cpu_offload=True (no accelerator)",
            "conformance-strict: every check passed or needs another environment; 1 declared"
            " unsupported (the strategy offers part of the space: --require-whole-space"
            " demands all of it)",
        ]
    )
    report = run.report()
    assert report["clauses"]["CFG-6"] == "passed"
    assert [c["outcome"] for c in report["checks"]] == ["passed", "unsupported"]


def test_require_whole_space_fails_a_strategy_that_offers_part(run_suite: RunSuite) -> None:
    run = run_suite(SUBSET, "--conformance-strict", "--require-whole-space")
    assert run.ret == pytest.ExitCode.TESTS_FAILED
    run.result.stdout.fnmatch_lines(
        [
            "conformance-strict: FAILED: 1 checks are neither passed nor environment"
            " (1 unsupported)",
            "*1 passed, 1 skipped, 1 nonconforming*",
        ]
    )


def test_strict_passes_with_passed_and_environment_only(run_suite: RunSuite) -> None:
    run = run_suite(GREEN, "--conformance-strict")
    assert run.ret == pytest.ExitCode.OK
    run.result.stdout.fnmatch_lines(
        ["conformance-strict: every check passed or needs another environment"]
    )


def test_strict_passes_an_expected_failure(run_suite: RunSuite) -> None:
    """A check that failed as the expected-failures file lists conforms (more cases in
    test_strict_verdicts.py)."""
    source = "def test_bad():\n    assert False\n"
    files = {"xf.txt": "test_fake.test_bad  known\n"}
    run = run_suite(source, "--conformance-strict", "--expected-failures", "xf.txt", files=files)
    assert run.outcomes() == {"test_fake.test_bad": "xfailed"}
    assert run.ret == pytest.ExitCode.OK


IDS = """
import pytest

class TestCheckpoint:
    @pytest.mark.clause("CKPT-RT-1")
    @pytest.mark.parametrize("fmt", ["full", "sharded"])
    def test_roundtrip(self, fmt):
        pass

@pytest.mark.clause("TRAIN-1")
@pytest.mark.parametrize("spec", [object()], ids=["adamw-fsdp"])
def test_parity(spec):
    pass
"""


def test_check_ids_are_readable_and_strip_the_suites_package(
    run_suite: RunSuite, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake project has its own ``suites`` package; in this in-process run the real one,
    # imported by other tests of this session, would otherwise shadow it.
    for name in [m for m in sys.modules if m == "suites" or m.startswith("suites.")]:
        monkeypatch.delitem(sys.modules, name)
    run = run_suite(None, files={"suites/__init__.py": "", "suites/test_ckpt.py": IDS})
    assert list(run.outcomes()) == [
        "test_ckpt.TestCheckpoint.test_roundtrip[full]",
        "test_ckpt.TestCheckpoint.test_roundtrip[sharded]",
        "test_ckpt.test_parity[adamw-fsdp]",
    ]


def test_report_json_schema(run_suite: RunSuite) -> None:
    run = run_suite(CLAUSED)
    report = run.report()
    assert report["schema_version"] == 2
    assert set(report["counts"]) == {
        "passed", "failed", "error", "unsupported", "environment", "xfailed", "not run", "desync",
        "hang", "blocked"
    }  # fmt: skip
    assert report["findings"] == []  # every check passed: no finding
    assert isinstance(report["suite_version"], str) and report["suite_version"]
    assert {"torch", "python", "backend", "device", "world_sizes"} <= set(report["environment"])
    assert report["environment"]["python"].count(".") == 2
    assert set(report["strategy"]) == {"factory", "options"}
    keys = {
        "id", "clauses", "outcome", "duration_s", "failure", "reproducer", "finding",
        "attributed_to", "family", "rank_jobs", "unsupported"
    }  # fmt: skip
    for check in report["checks"]:
        assert set(check) == keys
        assert check["duration_s"] >= 0
    assert run.check("test_fake.test_reshard")["clauses"] == ["CKPT-RT-3", "CKPT-STRICT-1"]
    assert run.check("test_fake.test_no_clause")["clauses"] == []


def test_reproducer_reruns_just_that_check(run_suite: RunSuite) -> None:
    source = "import pytest\n\n@pytest.mark.parametrize('ws', [2, 4])\ndef test_x(ws):\n    pass\n"
    run = run_suite(source, "--hypothesis-seed=7")
    words = shlex.split(run.check("test_fake.test_x[4]")["reproducer"])
    assert words[:2] == ["pytest", "test_fake.py::test_x[4]"]
    assert "--hypothesis-seed=7" in words
    assert "--conformance-report" not in words  # only what selects and configures the check


def test_report_markdown_layout(run_suite: RunSuite) -> None:
    run = run_suite(
        "import pytest\n\n"
        "@pytest.mark.clause('CLIP-1')\ndef test_clip():\n    assert 2 + 2 == 5\n\n"
        "@pytest.mark.clause('API-1')\ndef test_ok():\n    pass\n"
    )
    md = run.markdown()
    lines = md.splitlines()
    assert lines[0] == "# shardcheck conformance report"
    assert lines[2].startswith("**1 passed · 1 failed · 0 error · 0 unsupported")
    sections = [line for line in lines if line.startswith("## ")]
    assert sections[0].startswith("## 1 findings (first failure after ")
    assert sections[1:] == ["## Clauses", "## Failures", "## What the failing clauses require"]
    assert "### F1: CLIP-1" in lines
    assert "| CLIP-1 | failed | 1 | test_fake.test_clip (failed) |" in lines
    assert "| API-1 | passed | 1 |  |" in lines
    assert "### test_fake.test_clip: failed (CLIP-1, finding F1)" in lines
    assert "pytest test_fake.py::test_clip" in md
    failures = md.index("## Failures")
    assert md.index("## Clauses") < failures
    assert "assert (2 + 2) == 5" in md[failures:]  # the failure's text, not only the finding's


STOPPING = """
import pytest

@pytest.mark.clause("API-1")
def test_fails():
    assert False

@pytest.mark.clause("API-2")
def test_after():
    pass
"""


def test_checks_a_stopped_session_never_reached_are_not_run(run_suite: RunSuite) -> None:
    run = run_suite(STOPPING, "-x")
    assert run.outcomes() == {"test_fake.test_fails": "failed", "test_fake.test_after": "not run"}
    why = run.check("test_fake.test_after")["failure"]
    assert why.startswith("the session stopped before this check"), why
    assert run.report()["clauses"]["API-2"] == "not run"
    assert "| API-2 | not run |" in run.markdown()
    run.result.stdout.fnmatch_lines(["checks: 1 failed, 1 not run (2 checks, 2 clauses)"])


@pytest.mark.parametrize("with_report", [True, False], ids=["report", "no-report"])
def test_deselection_note_promises_a_list_only_where_one_is_written(
    pytester: pytest.Pytester, with_report: bool
) -> None:
    pytester.makepyfile(test_fake=CLAUSED)
    out = pytester.path / "out"
    report_args = ["--conformance-report", str(out)] if with_report else []
    result = pytester.runpytest(  # SYNC-1: a clause of the contract that no check declares
        *PLUGIN_ARGS, "-p", "no:cacheprovider", "--clauses", "SYNC-1", *report_args
    )
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    text = result.stdout.str()
    if with_report:
        result.stdout.fnmatch_lines([f"deselected: 4 checks (listed in {out / 'report.json'})"])
        selection = json.loads((out / "report.json").read_text())["selection"]
        assert len(selection["deselected"]) == 4
    else:
        result.stdout.fnmatch_lines(["deselected: 4 checks (--conformance-report DIR lists them)"])
        assert "listed in" not in text
    result.stdout.fnmatch_lines(["--clauses: 'SYNC-1' matched no clause*"])
