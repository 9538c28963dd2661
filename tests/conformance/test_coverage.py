"""The run's configuration coverage: pairs of axis values, supported and covered."""

from __future__ import annotations

from harness.conformance.checks import Check
from harness.conformance.coverage import MISSING_SHOWN, coverage_of, pairs_of
from harness.report import Report, render_markdown
from harness.report.markdown import coverage_line


def _check(outcome: str, *entries: dict[str, tuple[str, ...]]) -> Check:
    check = Check(f"c{outcome}{len(entries)}", "n", ["TRAIN-1"])
    check.outcome = outcome
    check.exercised = list(entries)
    return check


def test_pairs_are_every_value_of_one_axis_with_every_value_of_another() -> None:
    entry = {"family": ("fsdp",), "model": ("Block", "tied embedding"), "world_size": ("2",)}
    assert pairs_of(entry) == {
        ("family", "fsdp", "model", "Block"),
        ("family", "fsdp", "model", "tied embedding"),
        ("family", "fsdp", "world_size", "2"),
        ("model", "Block", "world_size", "2"),
        ("model", "tied embedding", "world_size", "2"),
    }


def test_a_pair_counts_as_covered_only_through_a_passing_check() -> None:
    passed = _check("passed", {"family": ("fsdp",), "precision": ("32-true",)})
    failed = _check("failed", {"family": ("fsdp",), "precision": ("bf16-mixed",)})
    both = coverage_of([passed, failed])
    assert both["pairs_covered"] == 1 and both["pairs_supported"] == 2
    assert both["values"] == {"family": ["fsdp"], "precision": ["32-true", "bf16-mixed"]}
    (row,) = both["by_axes"]
    assert row == {
        "axes": ["family", "precision"],
        "covered": 1,
        "supported": 2,
        "missing": [["fsdp", "bf16-mixed"]],
    }
    assert coverage_of([_check("passed")]) == {}  # no job reported its axes


def test_the_report_shows_the_figure_and_the_table_and_reads_it_back() -> None:
    entries: list[dict[str, tuple[str, ...]]] = [
        {"family": ("fsdp",), "world_size": (str(n),)} for n in range(12)
    ]
    coverage = coverage_of([_check("passed", entries[0]), _check("failed", *entries[1:])])
    report = Report("1", {}, {}, [], coverage=coverage)
    markdown = render_markdown(report)
    line = coverage_line(coverage)
    assert line.startswith("pairs of configuration values covered: 1 of 12 supported")
    assert "## Configuration coverage" in markdown and line in markdown
    missing = ", ".join(f"fsdp x {n}" for n in range(1, 1 + MISSING_SHOWN))
    assert f"| family x world_size | 1 | 12 | {missing} (+3 more) |" in markdown
    assert Report.from_dict(report.to_dict()).coverage == coverage
