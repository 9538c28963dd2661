"""The report model and ``python -m harness.report diff OLD.json NEW.json``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.report import (
    CheckResult,
    Report,
    ReportError,
    clause_outcomes,
    load_report,
    main,
    worst_outcome,
    write_report,
)


def make_report(torch: str, outcomes: dict[str, tuple[list[str], str]]) -> Report:
    checks = [
        CheckResult(id=cid, clauses=clauses, outcome=outcome, reproducer=f"pytest {cid}")
        for cid, (clauses, outcome) in outcomes.items()
    ]
    env = {"torch": torch, "python": "3.11.7", "backend": "gloo", "device": "cpu"}
    env["world_sizes"] = [2, 4]
    strategy = {"factory": "mypkg:make_strategy", "options": {}}
    return Report("0.1.0", env, strategy, checks)


OLD = {
    "test_ckpt.test_reshard[ws4]": (["CKPT-RT-3"], "passed"),
    "test_ckpt.test_reshard[ws2]": (["CKPT-RT-3"], "passed"),
    "test_train.test_parity[ws2]": (["TRAIN-1"], "passed"),
    "test_train.test_clip": (["CLIP-1"], "unsupported"),
    "test_cfg.test_offload": (["CFG-6"], "passed"),
}
NEW = {
    "test_ckpt.test_reshard[ws4]": (["CKPT-RT-3"], "failed"),
    "test_ckpt.test_reshard[ws2]": (["CKPT-RT-3"], "passed"),
    "test_train.test_parity[ws2]": (["TRAIN-1"], "passed"),
    "test_train.test_clip": (["CLIP-1"], "passed"),
    "test_sync.test_no_sync": (["SYNC-1"], "passed"),
}


@pytest.fixture
def two_reports(tmp_path: Path) -> tuple[Path, Path]:
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    write_report(make_report("2.12.0", OLD), old_dir)
    write_report(make_report("2.13.0", NEW), new_dir)
    return old_dir / "report.json", new_dir / "report.json"


def test_worst_outcome_order() -> None:
    assert worst_outcome(["passed", "environment"]) == "environment"
    assert worst_outcome(["unsupported", "xfailed", "passed"]) == "xfailed"
    assert worst_outcome(["error", "failed"]) == "failed"
    assert worst_outcome([]) == "passed"
    grouped = clause_outcomes(make_report("2.13.0", NEW).checks)
    assert grouped["CKPT-RT-3"][0] == "failed"
    assert [c.id for c in grouped["CKPT-RT-3"][1]] == [
        "test_ckpt.test_reshard[ws4]",
        "test_ckpt.test_reshard[ws2]",
    ]


def test_unknown_outcome_is_refused() -> None:
    with pytest.raises(ValueError, match=r"outcome='skipped' for check 'a.b' is not an outcome"):
        CheckResult(id="a.b", clauses=[], outcome="skipped")


def test_report_round_trips_through_json(two_reports: tuple[Path, Path]) -> None:
    old, _ = two_reports
    report = load_report(old)
    assert report.to_dict() == json.loads(old.read_text())
    assert report.counts()["unsupported"] == 1


def test_diff_lists_changed_clauses_and_added_removed_checks(
    two_reports: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = two_reports
    assert main(["diff", str(old), str(new)]) == 1  # a check that passed fails now
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"old: {old} (shardcheck 0.1.0, torch 2.12.0, strategy mypkg:")
    assert out[1].startswith(f"new: {new} (shardcheck 0.1.0, torch 2.13.0")
    assert out[3:] == [
        "worse: 1 checks fail that did not, 0 new findings",
        "  test_ckpt.test_reshard[ws4]: passed -> failed",
        "clauses whose outcome changed: 2",
        "  CKPT-RT-3: passed -> failed",
        "      test_ckpt.test_reshard[ws4]: passed -> failed",
        "  CLIP-1: unsupported -> passed",
        "      test_train.test_clip: unsupported -> passed",
        "clauses added: 1",
        "  SYNC-1 (passed)",
        "clauses removed: 1",
        "  CFG-6 (passed)",
        "checks added: 1",
        "  test_sync.test_no_sync (passed)",
        "checks removed: 1",
        "  test_cfg.test_offload (passed)",
    ]


def test_diff_of_identical_reports_says_so(
    two_reports: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    old, _ = two_reports
    assert main(["diff", str(old), str(old)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "no change: every clause has the same outcome and checks."
    )


def test_diff_runs_as_a_module(two_reports: tuple[Path, Path]) -> None:
    old, new = two_reports
    done = subprocess.run(
        [sys.executable, "-m", "harness.report", "diff", str(old), str(new)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr  # worse: a job gated on it fails
    assert "  CKPT-RT-3: passed -> failed" in done.stdout


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "does not exist"),
        ("{not json", "is not readable JSON"),
        ('{"hello": 1}', "is not a shardcheck report"),
        ('{"schema_version": 99, "checks": []}', "has schema_version=99; this shardcheck reads"),
    ],
    ids=["missing", "not-json", "not-a-report", "other-schema"],
)
def test_bad_report_files(
    tmp_path: Path,
    two_reports: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    match: str,
) -> None:
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    with pytest.raises(ReportError, match=match):
        load_report(bad)
    assert main(["diff", str(two_reports[0]), str(bad)]) == 2
    assert match in capsys.readouterr().err


def test_summary_headline_prefers_a_ranks_story() -> None:
    from harness.conformance.output.summary import headline

    story = (
        "harness.verdicts.outcomes.RankFailure: job 4: m:f at world size 2: rank 1 raised\n"
        "rank 1 raised NotImplementedError: no CheckpointIO after 0.08 s\n"
        "    Traceback (most recent call last):\n"
    )
    assert headline(story) == "rank 1 raised NotImplementedError: no CheckpointIO after 0.08 s"
    assert headline("AssertionError: CKPT-RT-1: lr differs\nmore") == (
        "AssertionError: CKPT-RT-1: lr differs"
    )
    assert headline(None) == ""


def test_reproducer_carries_plugins_and_shardcheck_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from harness.conformance.output.facts import reproducer

    args = [
        "suites/", "-pno:cacheprovider", "-p", "harness.conformance", "--nproc", "4",
        "--strategy-option", "use_orig_params=False", "--strategy-option=timeout=30",
        "--hypothesis-seed=3", "--conformance-report", "out", "-x", "--backend=gloo",
    ]  # fmt: skip
    config: Any = SimpleNamespace(invocation_params=SimpleNamespace(args=args))
    monkeypatch.setenv("SHARDCHECK_STRATEGY", "mypkg:make")
    text = "You can add @seed(9) ... --hypothesis-seed=99 ... @reproduce_failure('6.1', b'AAE=')"
    line = reproducer(config, "suites/test_x.py::test_y[ws4]", text)
    assert line == (
        "pytest 'suites/test_x.py::test_y[ws4]' -pno:cacheprovider -p harness.conformance "
        "--nproc 4 --strategy-option use_orig_params=False --strategy-option=timeout=30 "
        "--backend=gloo --strategy mypkg:make --hypothesis-seed=99 --reproduce-failure=6.1:AAE="
    )
    assert reproducer(config, "t.py::a", "").endswith("--strategy mypkg:make --hypothesis-seed=3")


def test_a_schema_1_report_is_still_read_and_not_run_sorts_above_skips(tmp_path: Path) -> None:
    old = make_report("2.12.0", OLD).to_dict()
    old["schema_version"] = 1
    del old["counts"]["not run"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(old))
    report = load_report(path)
    assert report.schema_version == 1 and len(report.checks) == len(OLD)
    assert worst_outcome(["not run", "xfailed", "unsupported", "passed"]) == "not run"
    assert worst_outcome(["not run", "error"]) == "error"
