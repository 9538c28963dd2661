"""A strategy that offers part of the configuration space: a clause passes where what it
offers passes, strict mode passes it unless --require-whole-space, and per-family columns
leave out a family the strategy refused entirely."""

from __future__ import annotations

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


def test_no_family_is_charged_with_checks_of_no_family() -> None:
    """A check of no one family (its examples may all have been of one family) fails the
    clause, not a family's column: neither the refused family nor the one that passed."""
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
    assert by_family["CKPT-RT-1"] == {"fsdp": "passed", "model_parallel": "unsupported"}
    assert clause_outcomes(checks, [finding])["CKPT-RT-1"][0] == "failed"
    # a failure of the family's own check still reads in its column
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
    clause, and reads fsdp=unsupported (not failed)."""
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
        "| CKPT-RT-1 | failed | fsdp=unsupported, model_parallel=passed | 1 of 4 | `rt[drawn]` |"
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
