"""The files beside ``report.json``: ``summary.md`` (capped), ``report.html`` (self-contained),
and ``report.json``'s ``run`` facts; built from synthetic reports, no ranks."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.report import (
    SUMMARY_LIMIT,
    CheckResult,
    FindingResult,
    Report,
    load_report,
    render_html,
    render_markdown,
    render_summary,
    verdict,
    write_report,
)
from harness.report.cost import cost_of, footprint, human_bytes
from harness.report.matrix import COVERED, NEVER, OUTSIDE, REACHED, coverage_matrix
from tests.conformance.cost_sample import PARAMS, PLAIN, cost_report, measurements

NASTY = "<script>alert('x')</script> & </td> | `tick` ```fence```"
RUN = {
    "hypothesis_profile": "ci",
    "hypothesis_seed": 12,
    "started_at": "2026-01-02T03:04:05Z",
    "wall_time_s": 61.5,
}
COVERAGE = {
    "pairs_covered": 3,
    "pairs_supported": 4,
    "pairs_declared": 6,
    "never_reached": [["precision", "16-true", "world_size", "4"]],
    "never_reached_count": 1,
    "values": {"precision": ["32-true", "bf16-mixed"], "world_size": ["2", "4"]},
    "by_axes": [
        {"axes": ["precision", "world_size"], "covered": 3, "supported": 4, "missing": []}
    ],
    "by_clause": {
        "CKPT-RT-1": {
            "precision": {"covered": ["32-true"], "reached": ["32-true", "bf16-mixed"],
                          "never": ["16-true"]},
            "world_size": {"covered": ["2", "4"], "reached": ["2", "4"], "never": []},
        },
        "TRAIN-1": {"world_size": {"covered": ["2"], "reached": ["2"], "never": []}},
    },
}  # fmt: skip


def small_report(**overrides: object) -> Report:
    checks = [
        CheckResult("test_ckpt.test_rt[fsdp-full]", ["CKPT-RT-1"], "failed", failure=NASTY,
                    finding="F1", attributed_to=["CKPT-RT-1"], family="fsdp"),
        CheckResult("test_ckpt.test_rt[mp-full]", ["CKPT-RT-1"], "passed",
                    family="model_parallel"),
        CheckResult("test_train.test_parity", ["TRAIN-1"], "passed"),
        CheckResult("test_train.test_clip", ["CLIP-1"], "unsupported",
                    failure="unsupported: clip=norm (no)"),
    ]  # fmt: skip
    findings = [
        FindingResult("F1", ["CKPT-RT-1"], "CKPT-RT-1: AssertionError: x", NASTY,
                      where="mine.py:3 load", checks=[checks[0].id],
                      example="Failing test case: test_rt(\n    n=7,\n)", reproduce="pytest x")
    ]  # fmt: skip
    report = Report(
        "0.1.0",
        {"torch": "2.13.0", "python": "3.11.7", "backend": "gloo", "device": "cpu",
         "world_sizes": [2, 4]},
        {"factory": "mine:make_strategy", "options": {}},
        checks, findings=findings, coverage=COVERAGE, run=dict(RUN),
    )  # fmt: skip
    for key, value in overrides.items():
        setattr(report, key, value)
    return report


def huge_report(checks: int, findings: int) -> Report:
    """Thousands of failing checks over hundreds of clauses, each with its own finding, and
    long messages full of characters Markdown and HTML care about."""
    results = [
        CheckResult(
            f"test_suite_{i % 50}.test_property_with_a_long_name[fsdp-FULL_SHARD-bf16-mixed-{i}]",
            [f"CLAUSE-{i % 400}", f"OTHER-{i % 300}"],
            "failed" if i % 7 else "blocked",
            failure=f"AssertionError: rank {i}: {NASTY} " + "x" * 500,
            finding=f"F{i % findings + 1}",
        )
        for i in range(checks)
    ]
    found = [
        FindingResult(
            f"F{j + 1}", [f"CLAUSE-{j % 400}"], f"sig {j}", f"message {j}: {NASTY} " + "y" * 400,
            checks=[c.id for c in results[j::findings]], example="Failing test case: t(\n)",
        )
        for j in range(findings)
    ]  # fmt: skip
    return Report("0.1.0", {"torch": "2.13.0"}, {"factory": "m:f", "options": {}}, results,
                  findings=found, run=dict(RUN))  # fmt: skip


# -- summary.md -----------------------------------------------------------------------------


def test_summary_of_a_small_run_has_verdict_findings_clauses_and_pointer() -> None:
    text = render_summary(small_report())
    assert text.startswith("## shardcheck conformance: FAILED\n")
    assert "1 of 4 checks did not pass (1 failed); 1 finding." in text
    assert "profile `ci` · seed 12 · started 2026-01-02T03:04:05Z · 61.5 s" in text
    row = next(line for line in text.splitlines() if line.startswith("| F1 |"))
    assert row.startswith("| F1 |  | CKPT-RT-1 | ``") and row.endswith(
        "| `test_ckpt.test_rt[fsdp-full]` | 1 |"
    )
    assert "\\|" in row  # the pipe of the message does not split the table
    clause = next(line for line in text.splitlines() if line.startswith("| CKPT-RT-1 |"))
    assert "fsdp=failed, model_parallel=passed" in clause and "1 of 2" in clause
    assert "\n| CLIP-1 | unsupported |" in text  # its only check was declared unsupported
    assert "Passed (1): TRAIN-1" in text
    assert "`report.md`" in text and "`report.html`" in text


def test_summary_stays_under_the_cap_with_thousands_of_failures() -> None:
    report = huge_report(checks=6000, findings=1500)
    text = render_summary(report)
    assert len(text.encode()) <= SUMMARY_LIMIT < 64 * 1024
    lines = text.splitlines()
    findings = [line for line in lines if re.match(r"\| F\d+ \|", line)]
    assert 10 < len(findings) < 1500  # as many as fit, not none
    assert re.search(r"^\.\.\. and \d+ more findings \(see report\.md\)$", text, re.M)
    shown = int(re.search(r"and (\d+) more findings", text).group(1))  # type: ignore[union-attr]
    assert len(findings) + shown == 1500
    assert re.search(r"^\.\.\. and \d+ more clauses \(see report\.md\)$", text, re.M)
    assert text.startswith("## shardcheck conformance: FAILED")
    assert text.rstrip().endswith("`python -m harness.report diff OLD.json NEW.json`).")
    assert max(len(line) for line in lines) < 1000  # every cell clipped


def test_summary_cut_holds_any_limit_and_refuses_a_useless_one() -> None:
    report = huge_report(checks=300, findings=100)
    for limit in (1000, 3000, 20_000):
        assert len(render_summary(report, limit).encode()) <= limit
    with pytest.raises(ValueError, match=r"limit=10 bytes is too small; pass at least 1000"):
        render_summary(report, 10)


def test_verdict_words() -> None:
    assert verdict(small_report()).word == "failed"
    passing = small_report(findings=[])
    passing.checks = [c for c in passing.checks if c.outcome != "failed"]
    assert verdict(passing).word == "passed"
    assert verdict(passing).sentence == "2 of 3 checks passed; 1 unsupported"
    passing.checks.append(CheckResult("t.stopped", ["API-1"], "not run"))
    assert verdict(passing).word == "incomplete"


# -- report.html ------------------------------------------------------------------------------


class _Page(HTMLParser):
    """Collects tags, links to anything outside the page, and the text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.external: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.external.append(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_is_self_contained_escaped_and_has_every_part() -> None:
    page = render_html(small_report())
    parser = _Page()
    parser.feed(page)
    assert page.startswith("<!DOCTYPE html>")
    assert "script" not in parser.tags and "link" not in parser.tags and "img" not in parser.tags
    assert parser.external == [] and "http" not in page and "@import" not in page
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    text = "".join(parser.text)
    assert NASTY in text  # the message reads as it was, once unescaped
    for part in ("FAILED", "Findings (1)", "Clauses (3)", "Configuration coverage",
                 "Checks that did not pass (2)", "Failing test case: test_rt("):  # fmt: skip
        assert part in text
    assert '<td class="c-covered" title="CKPT-RT-1 precision=32-true: covered">' in page
    assert '<td class="c-never" title="CKPT-RT-1 precision=16-true: never reached">' in page
    assert '<td class="c-reached" title="CKPT-RT-1 precision=bf16-mixed: not passed">' in page


def test_html_of_a_run_without_coverage_or_findings() -> None:
    report = small_report(findings=[], coverage={}, run={})
    page = render_html(report)
    assert "No job of this run reported its configuration axes." in page
    assert "<h2>Findings</h2>" in page and "<p>None.</p>" in page


def test_coverage_matrix_states() -> None:
    matrix = coverage_matrix(COVERAGE)
    assert matrix is not None
    assert matrix.columns == [
        ("precision", "16-true"), ("precision", "32-true"), ("precision", "bf16-mixed"),
        ("world_size", "2"), ("world_size", "4"),
    ]  # fmt: skip
    assert dict(matrix.rows) == {
        "CKPT-RT-1": [NEVER, COVERED, REACHED, COVERED, COVERED],
        "TRAIN-1": [OUTSIDE, OUTSIDE, OUTSIDE, COVERED, OUTSIDE],
    }
    assert matrix.axes() == [("precision", 3), ("world_size", 2)]
    assert coverage_matrix({}) is None


# -- the files and report.json --------------------------------------------------------------


def test_write_report_writes_four_files_and_run_round_trips(tmp_path: Path) -> None:
    files = write_report(small_report(), tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "report.html", "report.json", "report.md", "summary.md",
    ]  # fmt: skip
    assert files.summary.read_text().startswith("## shardcheck conformance: FAILED")
    document = json.loads(files.json.read_text())
    assert document["run"] == RUN
    assert document["findings"][0]["example"] == "Failing test case: test_rt(\n    n=7,\n)"
    assert load_report(files.json).run == RUN


def test_a_report_without_run_facts_still_loads(tmp_path: Path) -> None:
    document = small_report().to_dict()
    del document["run"]  # written by an earlier shardcheck
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    report = load_report(path)
    assert report.run == {}
    assert "profile" not in render_summary(report) and "started" not in render_html(report)


# -- the cost section -------------------------------------------------------------------------


class _Elements(HTMLParser):
    """Every start tag with its attributes, in order, and each ``<svg>``'s own elements."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.in_svg: dict[str, list[tuple[str, dict[str, str]]]] = {}
        self._svg: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = (tag, {k: v or "" for k, v in attrs})
        self.elements.append(found)
        if tag == "svg":
            self._svg = found[1].get("id", "")
            self.in_svg[self._svg] = []
        elif self._svg is not None:
            self.in_svg[self._svg].append(found)

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._svg = None

    def of(self, svg: str, cls: str) -> list[dict[str, str]]:
        return [a for _, a in self.in_svg[svg] if cls in a.get("class", "").split()]


FAMILIES = ["fsdp", "fsdp2", "model_parallel"]


def test_html_draws_bytes_per_rank_against_world_size_per_family() -> None:
    page = render_html(cost_report())
    parser = _Elements()
    parser.feed(page)
    assert "script" not in [tag for tag, _ in parser.elements] and "http" not in page
    assert set(parser.in_svg) == {"cost-chart", "cost-projection"}
    series = parser.of("cost-chart", "series")
    assert [s["data-family"] for s in series] == FAMILIES
    for line in series:  # four world sizes, fewer bytes per rank (a larger y) at each
        ys = [float(xy.split(",")[1]) for xy in line["points"].split()]
        assert len(ys) == 4 and ys == sorted(ys) and ys[0] < ys[-1]
    points = parser.of("cost-chart", "point")
    assert [(p["data-family"], p["data-world"]) for p in points] == [
        (f, str(w)) for f in FAMILIES for w in (1, 2, 3, 4)
    ]
    assert points[0]["data-bytes"] == str(PARAMS + 2 * PARAMS + 208)
    plain = parser.of("cost-chart", "plain-model")
    assert [p["data-bytes"] for p in plain] == [str(footprint(PLAIN))]
    legend = [
        a["data-family"] for a in parser.of("cost-chart", "legend-entry") if a.get("data-family")
    ]
    assert legend == FAMILIES
    assert "model_parallel (same as fsdp2)" in page  # drawn on fsdp2's points, and said so
    assert "plain model: 553 KiB" in page
    projected = parser.of("cost-projection", "projected")
    assert {(p["data-family"], p["data-world"]) for p in projected} == {
        (f, w) for f in FAMILIES for w in ("8", "64", "512")
    }
    assert [p["data-family"] for p in parser.of("cost-projection", "projection")] == FAMILIES
    assert "Projection to 8, 64 and 512 ranks: fitted, not measured" in page


def test_html_cost_tables_mark_the_projection() -> None:
    page = render_html(cost_report())
    tables = [a for tag, a in _parsed(page) if tag == "table" and "cost" in a.get("class", "")]
    assert [t["data-family"] for t in tables] == FAMILIES
    assert page.count('<tr class="projection"><td>512 (projected)</td>') == 3
    assert page.count('<tr class="measured">') == 12  # the series, not the NO_SHARD extra
    assert "<th>all_gather</th><th>reduce_scatter</th>" in page
    assert '<td class="b">17, 271 KiB</td>' in page  # count, bytes
    assert "13 configurations measured" in page
    assert "No job of this run reported" in page  # the rest of the page is still there


def _parsed(page: str) -> list[tuple[str, dict[str, str]]]:
    parser = _Elements()
    parser.feed(page)
    return parser.elements


def test_a_report_without_cost_has_no_cost_section() -> None:
    report = small_report()
    assert 'id="cost' not in render_html(report)
    assert "## Cost" not in render_markdown(report)
    assert "### Cost" not in render_summary(report)


def test_markdown_lists_every_configuration_and_the_projection() -> None:
    text = render_markdown(cost_report())
    cost = text[text.index("## Cost") : text.index("## Failures")]
    assert [line for line in cost.splitlines() if line.startswith("### ")] == [
        "### fsdp", "### fsdp2", "### model_parallel", "### Every configuration measured",
    ]  # fmt: skip
    assert cost.count("| 64 (projected) | projection: fixed + sharded / world, not measured |") == 3
    full = cost[cost.index("### Every configuration measured") :]
    rows = [line for line in full.splitlines() if line.startswith("| fsdp") or
            line.startswith("| model_parallel")]  # fmt: skip
    assert len(rows) == 13
    no_shard = next(r for r in rows if "NO_SHARD" in r)
    assert "| fsdp | 2 | 415 KiB, 415 KiB | 415 KiB (params 138 KiB, optimizer 277 KiB) |" in (
        no_shard
    )
    assert "step: all_reduce 9 (138 KiB); clip: all_reduce 1 (4 B)" in rows[0]


def test_summary_has_the_short_cost_table() -> None:
    text = render_summary(cost_report())
    assert "### Cost: bytes per rank at rest, after the step" in text
    head = next(line for line in text.splitlines() if line.startswith("| family |"))
    assert head == (
        "| family | world 1 | world 2 | world 3 | world 4 | plain model | 8 (projected) "
        "| 64 (projected) | 512 (projected) |"
    )
    row = next(line for line in text.splitlines() if line.startswith("| fsdp |"))
    assert row.startswith("| fsdp | 415 KiB | 207 KiB | 138 KiB | 104 KiB | 553 KiB | ")
    assert text.index("### Cost") < text.index("Full report beside this file")


def test_summary_with_cost_stays_under_the_cap() -> None:
    report = huge_report(checks=6000, findings=1500)
    report.cost = cost_of(measurements())
    text = render_summary(report)
    assert len(text.encode()) <= SUMMARY_LIMIT
    assert "### Cost: bytes per rank at rest, after the step" in text
    assert "| model_parallel | 415 KiB |" in text


def test_cost_round_trips_through_report_json(tmp_path: Path) -> None:
    files = write_report(cost_report(), tmp_path)
    loaded = load_report(files.json)
    assert loaded.cost == json.loads(json.dumps(cost_report().cost))
    assert render_html(loaded) == files.html.read_text()


def test_human_bytes() -> None:
    assert [human_bytes(b) for b in (0, 903, 1023, 1024, 6707, 424_624, 1_258_291)] == [
        "0 B", "903 B", "1023 B", "1 KiB", "6.55 KiB", "415 KiB", "1.2 MiB",
    ]  # fmt: skip
    assert human_bytes(1023 * 1024) == "0.999 MiB"  # never "1.02e+03 KiB"


def test_a_cost_of_one_world_size_has_no_projection_anywhere() -> None:
    one = [m for m in measurements() if m["world_size"] == 1]
    report = cost_report()
    report.cost = cost_of(one)
    page = render_html(report)
    assert 'id="cost-chart"' in page and 'id="cost-projection"' not in page
    assert page.count('class="series"') == 3 and "(projected)" not in page
    assert "No projection: fewer than two world sizes were measured." in page
    summary = render_summary(report)
    row = next(line for line in summary.splitlines() if line.startswith("| fsdp |"))
    assert row == "| fsdp | 415 KiB | 553 KiB | - | - | - |"
    assert "(projected)" not in render_markdown(report).split("## Cost")[1].split("### Every")[0]
