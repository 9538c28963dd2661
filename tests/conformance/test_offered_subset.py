"""A strategy that offers part of the configuration space: a clause passes where what it
offers passes, strict mode passes it unless --require-whole-space, and per-family columns
leave out a family the strategy refused entirely."""

from __future__ import annotations

import json
from pathlib import Path

from harness.report import (
    CheckResult,
    FindingResult,
    Report,
    clause_family_outcomes,
    clause_outcomes,
    declared_unsupported,
    nonconforming,
    offered_outcome,
    render_summary,
    write_report,
)
from harness.report.verdict import verdict

REFUSED_MP = "unsupported: family=model_parallel (no tensor parallelism)"


def check(id: str, outcome: str, family: str = "", **kw: object) -> CheckResult:
    failure = REFUSED_MP if outcome == "unsupported" and family == "model_parallel" else None
    return CheckResult(
        id=id, clauses=["CKPT-RT-1"], outcome=outcome, family=family, failure=failure, **kw
    )  # type: ignore[arg-type]


FSDP_ONLY = [
    check(
        "rt[fsdp]",
        "passed",
        "fsdp",
        unsupported=["unsupported: sharding_strategy=HYBRID_SHARD (no)"],
    ),
    check("rt[model_parallel]", "unsupported", "model_parallel"),
]


def test_unsupported_does_not_count_against_a_passed_check() -> None:
    assert offered_outcome(["passed", "unsupported"]) == "passed"
    assert offered_outcome(["unsupported"]) == "unsupported"
    assert offered_outcome(["passed", "unsupported", "failed"]) == "failed"
    # a check that needs another machine does not count against the ones that ran and passed
    assert offered_outcome(["passed", "environment"]) == "passed"
    assert offered_outcome(["environment", "unsupported"]) == "unsupported"
    assert offered_outcome(["environment"]) == "environment"
    assert offered_outcome(["passed", "environment", "xfailed"]) == "xfailed"
    assert clause_outcomes(FSDP_ONLY)["CKPT-RT-1"][0] == "passed"


def test_strict_passes_a_subset_and_whole_space_does_not() -> None:
    assert nonconforming(FSDP_ONLY) == []
    assert [c.id for c in nonconforming(FSDP_ONLY, whole_space=True)] == ["rt[model_parallel]"]


def test_a_strategy_that_refused_everything_does_not_conform() -> None:
    refused = [check("a", "unsupported", "model_parallel"), check("b", "environment")]
    assert [c.id for c in nonconforming(refused)] == ["a"]


def test_failures_stay_nonconforming() -> None:
    bad = [*FSDP_ONLY, check("x", "failed", "fsdp"), check("y", "blocked", "fsdp")]
    assert [c.id for c in nonconforming(bad)] == ["x", "y"]


def test_the_declared_values_are_listed_once_each() -> None:
    assert declared_unsupported(FSDP_ONLY) == [
        "family=model_parallel (no tensor parallelism)",
        "sharding_strategy=HYBRID_SHARD (no)",
    ]
    assert declared_unsupported(FSDP_ONLY, reasons=False) == [
        "family=model_parallel",
        "sharding_strategy=HYBRID_SHARD",
    ]


def test_a_check_of_no_family_counts_in_each_family_offered() -> None:
    """A check of no one family (it draws its family) ran on the families the strategy
    offers: its failure reads in the cell of each of them and in the clause, not in the cell
    of the family the strategy refused (the table once read fsdp=passed beside a failed
    clause)."""
    checks = [*FSDP_ONLY, check("teardown", "failed", "", finding="F1")]
    finding = FindingResult(
        id="F1",
        clauses=["CKPT-RT-1"],
        signature="s",
        message="m",
        where="",
        checks=["teardown"],
        example="",
        reproduce="",
        found_after_s=1.0,
    )
    by_family = clause_family_outcomes(checks, [finding])
    assert by_family["CKPT-RT-1"] == {"fsdp": "failed", "model_parallel": "unsupported"}
    assert clause_outcomes(checks, [finding])["CKPT-RT-1"][0] == "failed"
    # a failure of the family's own check reads in its column alone
    own = [*FSDP_ONLY, check("rt[fsdp-2]", "failed", "fsdp", finding="F1")]
    finding.checks = ["rt[fsdp-2]"]
    assert clause_family_outcomes(own, [finding])["CKPT-RT-1"]["fsdp"] == "failed"


def _report(checks: list[CheckResult], **run: object) -> Report:
    return Report("0.1.0", {}, {"factory": "m:f", "options": {}}, checks, run=dict(run))


def test_the_verdict_passes_a_subset_unless_the_whole_space_is_required() -> None:
    assert verdict(_report(FSDP_ONLY)).word == "passed"
    whole = verdict(_report(FSDP_ONLY, require_whole_space=True))
    assert (whole.word, whole.sentence) == (
        "failed",
        "1 of 2 checks unsupported and --require-whole-space is given",
    )
    nothing = verdict(_report([check("a", "unsupported", "model_parallel")]))
    assert (nothing.word, nothing.sentence) == (
        "failed",
        "1 of 1 checks unsupported and the strategy declared every check it met unsupported",
    )


def test_the_first_column_points_at_what_decided_the_clause() -> None:
    """A strategy that refuses the fsdp family: its fsdp checks are unsupported, a check of no
    family failed. The clause row names the failed check first, counts only it against the
    clause, and reads fsdp=unsupported (not failed) and model_parallel=failed (the family the
    failed check ran on, as the only one offered)."""
    checks = [
        check("rt[fsdp-a]", "unsupported", "fsdp"),
        check("rt[fsdp-b]", "unsupported", "fsdp"),
        check("rt[model_parallel]", "passed", "model_parallel"),
        check("rt[drawn]", "failed", "", finding="F1", attributed_to=["CKPT-RT-1"]),
    ]
    row = next(
        line
        for line in render_summary(_report(checks)).splitlines()
        if line.startswith("| CKPT-RT-1 |")
    )
    assert row == (
        "| CKPT-RT-1 | failed | fsdp=unsupported, model_parallel=failed | 1 of 4 | `rt[drawn]` |"
    )


def test_a_clause_no_check_counts_against_says_why_in_the_first_column() -> None:
    """A clause whose every check the strategy refused has no check to name first: the cell
    says they were declared unsupported (it once read "(a finding)", naming none)."""
    checks = [*FSDP_ONLY, check("other", "passed", "fsdp")]
    checks[0] = check("rt[fsdp]", "unsupported", "fsdp")
    checks[2].clauses = ["API-1"]
    row = next(
        line
        for line in render_summary(_report(checks)).splitlines()
        if line.startswith("| CKPT-RT-1 |")
    )
    assert row.endswith("| 0 of 2 | (every check declared unsupported) |"), row


def _finding(id: str, clause: str, checks: list[str]) -> FindingResult:
    return FindingResult(id=id, clauses=[clause], signature=id, message="m", checks=checks)


def _one_family_run() -> Report:
    """An fsdp2 strategy (it refuses fsdp and model_parallel) measured as the user of issue
    46 was: AC-1 and CLIP-1 fail in checks that draw their family, MP-3 passes in a check of
    no one family beside its refused model_parallel checks (MP-3 applies to model_parallel
    only, so it is not applicable here), CKPT-RT-1 fails in an fsdp2 check, TRAIN-1 passes.
    Each refusal names the family it refuses."""

    def one(id: str, clauses: list[str], outcome: str, family: str = "") -> CheckResult:
        failing = outcome == "failed"
        return CheckResult(
            id=id,
            clauses=clauses,
            outcome=outcome,
            family=family,
            finding=f"F-{id}" if failing else None,
            attributed_to=clauses[:1] if failing else [],
            failure=f"unsupported: family={family} (no)" if outcome == "unsupported" else None,
        )

    checks = [
        one("ac[fsdp2]", ["AC-1"], "passed", "fsdp2"),
        one("ac[fsdp]", ["AC-1"], "unsupported", "fsdp"),
        one("ac_drawn", ["AC-1"], "failed"),
        one("clip[fsdp2]", ["CLIP-1"], "passed", "fsdp2"),
        one("clip_drawn", ["CLIP-1"], "failed"),
        one("rt[model_parallel]", ["MP-3"], "unsupported", "model_parallel"),
        one("resume", ["CKPT-RT-5", "MP-3"], "passed"),
        one("rt[fsdp2]", ["CKPT-RT-1"], "failed", "fsdp2"),
        one("rt[fsdp]", ["CKPT-RT-1"], "unsupported", "fsdp"),
        one("train[fsdp2]", ["TRAIN-1"], "passed", "fsdp2"),
    ]
    findings = [_finding(f"F-{c.id}", c.clauses[0], [c.id]) for c in checks if c.finding]
    report = _report(checks)
    report.findings = findings
    return report


def _table(text: str, head: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header row starts with ``head``, by column."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(head))
    names = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


def test_the_clause_table_has_one_meaning(tmp_path: Path) -> None:
    """A clause and its family cells agree by the rule of [Note: one meaning in the clause
    table]: report.json, report.md and summary.md of a one-family strategy read a clause
    ``failed`` exactly when a cell does, the offered family's cell as the clause, and a
    clause that passed on the family offered ``passed`` beside its refused family; a clause
    of no family offered (MP-3) reads ``not applicable``, its cell of a family it does not
    apply to too ([Note: not applicable])."""
    files = write_report(_one_family_run(), tmp_path)
    data = json.loads(files.json.read_text())
    clauses, cells = data["clauses"], data["clauses_by_family"]
    assert clauses == {
        "AC-1": "failed",
        "CKPT-RT-1": "failed",
        "CKPT-RT-5": "passed",
        "CLIP-1": "failed",
        "MP-3": "not applicable",
        "TRAIN-1": "passed",
    }
    assert cells["AC-1"] == {"fsdp": "unsupported", "fsdp2": "failed"}
    assert cells["CLIP-1"] == {"fsdp2": "failed"}
    assert cells["MP-3"] == {"fsdp2": "not applicable", "model_parallel": "unsupported"}
    for clause, outcome in clauses.items():
        row = cells.get(clause, {})
        assert (outcome == "failed") == ("failed" in row.values()), clause
        if "fsdp2" in row:  # the one family offered reads as its clause
            assert row["fsdp2"] == outcome, clause

    table = _table(files.markdown.read_text(), "| clause | outcome |")
    assert {r["clause"]: r["outcome"] for r in table} == clauses
    for row in table:
        cell = {f: row[f] for f in ("fsdp", "fsdp2", "model_parallel") if row[f] != "-"}
        assert cell == cells.get(row["clause"], {}), row
    summary = _table(files.summary.read_text(), "| clause | outcome |")
    assert {r["clause"]: r["outcome"] for r in summary} == {
        c: o for c, o in clauses.items() if o != "passed"
    }
    for row in summary:
        split = dict(pair.split("=") for pair in row["by family"].split(", ") if pair)
        assert split == cells.get(row["clause"], {}), row
    assert "Passed (2): CKPT-RT-5, TRAIN-1" in files.summary.read_text()
