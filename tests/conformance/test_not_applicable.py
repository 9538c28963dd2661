"""A clause that applies to none of the families a strategy offers reads ``not applicable``
([Note: not applicable] in harness/report/model.py): the contract says per clause which
families it applies to, the report knows the families offered from what the strategy refused
as a whole, and every writer reads the same outcome. No ranks: reports built by hand."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import harness.contract
from harness.clauses import CLAUSES, FAMILIES
from harness.clauses.markdown import render_markdown as render_contract
from harness.clauses.registry import Clause
from harness.conformance.output.summary import summary_lines
from harness.report import (
    CheckResult,
    FindingResult,
    Report,
    clause_family_outcomes,
    clause_outcomes,
    nonconforming,
    refused_families,
    render_summary,
    write_report,
)
from harness.report.outcome import CHECK_OUTCOMES, Outcome
from harness.report.verdict import verdict


def refused(family: str) -> str:
    return f"unsupported: family={family} (this strategy builds another family)"


def one(id: str, clauses: list[str], outcome: str, family: str = "", **kw: object) -> CheckResult:
    given = kw.pop("failure", None)
    failure = refused(family) if outcome == "unsupported" and family and not given else given
    return CheckResult(
        id=id, clauses=clauses, outcome=outcome, family=family, failure=failure, **kw
    )  # type: ignore[arg-type]


def _report(checks: list[CheckResult], findings: list[FindingResult] | None = None) -> Report:
    return Report("0.1", {}, {"factory": "m:f", "options": {}}, checks, findings=findings or [])


def model_parallel_only() -> list[CheckResult]:
    """A model_parallel-only strategy (it refuses fsdp and fsdp2 by naming the family)."""
    return [
        one("mesh[model_parallel]", ["CFG-8"], "passed", "model_parallel"),
        one("names[fsdp]", ["CFG-1"], "unsupported", "fsdp"),
        one("offload[fsdp]", ["CFG-6"], "unsupported", "fsdp"),
        one("offload[fsdp2]", ["CFG-6"], "unsupported", "fsdp2"),
        one("wrap[fsdp]", ["WRAP-1", "API-2"], "unsupported", "fsdp"),
        one("fsdp2_units[fsdp2]", ["FSDP2-1"], "unsupported", "fsdp2"),
        # a check of no one family that ran model_parallel and passed, declaring an fsdp clause
        one("policies", ["CFG-4", "TRAIN-1"], "passed"),
        one("rt[fsdp]", ["CKPT-RT-1"], "unsupported", "fsdp"),
        one("rt[model_parallel]", ["CKPT-RT-1", "MP-3"], "passed", "model_parallel"),
    ]


def test_every_clause_names_the_families_it_applies_to() -> None:
    assert FAMILIES == harness.contract.FAMILIES
    for clause in CLAUSES.values():
        assert clause.scope[0][0] == "family" and clause.families, clause.id
        assert set(clause.families) <= set(FAMILIES), clause.id
    assert CLAUSES["CFG-6"].families == ("fsdp", "fsdp2")
    assert CLAUSES["CFG-8"].families == ("model_parallel",)
    assert CLAUSES["WRAP-1"].families == ("fsdp",)
    assert CLAUSES["FSDP2-1"].families == ("fsdp2",)
    assert CLAUSES["TRAIN-1"].families == FAMILIES  # written without one: every family
    assert Clause("X-1", "x", (("precision", ("32-true",)),)).scope == (
        ("family", FAMILIES),
        ("precision", ("32-true",)),
    )
    with pytest.raises(ValueError, match=r"'X-1'.*\['fsdp3'\]"):
        Clause("X-1", "x", (("family", ("fsdp3",)),))
    contract = render_contract()
    assert "| id | families | clause |" in contract
    assert "| CFG-6 | fsdp, fsdp2 | " in contract and "| TRAIN-1 | every family | " in contract


def test_the_families_offered_are_known_from_whole_family_refusals() -> None:
    assert refused_families(model_parallel_only()) == {"fsdp", "fsdp2"}
    # a refusal that names no option leaves the family unknown
    vague = [one("x[fsdp]", ["CFG-1"], "unsupported", "fsdp", failure="unsupported: no fsdp")]
    assert refused_families([*vague, one("y", ["CFG-8"], "passed", "model_parallel")]) == set()
    # a family one of whose checks ran is offered, whatever was refused on the way
    ran = one("z[fsdp]", ["CFG-1"], "passed", "fsdp", unsupported=[refused("fsdp")])
    assert refused_families([ran, one("w[fsdp]", ["CFG-2"], "unsupported", "fsdp")]) == set()
    # a strategy that refused every family offered nothing: nothing is "not applicable"
    everything = [one(f"r[{f}]", ["API-1"], "unsupported", f) for f in FAMILIES]
    assert refused_families(everything) == set()
    assert clause_outcomes(everything)["API-1"][0] == "unsupported"


def test_a_clause_of_no_family_offered_reads_not_applicable() -> None:
    table = {c: o for c, (o, _) in clause_outcomes(model_parallel_only()).items()}
    assert table == {
        "API-2": "unsupported",  # it applies to model_parallel: unsupported, not "not applicable"
        "CFG-1": "not applicable",
        "CFG-4": "not applicable",  # never "passed": it asks nothing of model_parallel
        "CFG-6": "not applicable",
        "CFG-8": "passed",
        "CKPT-RT-1": "passed",
        "FSDP2-1": "not applicable",
        "MP-3": "passed",
        "TRAIN-1": "passed",
        "WRAP-1": "not applicable",
    }
    cells = clause_family_outcomes(model_parallel_only())
    assert cells["CKPT-RT-1"] == {"fsdp": "unsupported", "model_parallel": "passed"}
    # the cell of a family the clause does not apply to
    assert cells["MP-3"] == {"model_parallel": "passed"}
    assert cells["CFG-6"] == {"fsdp": "unsupported", "fsdp2": "unsupported"}
    assert nonconforming(model_parallel_only()) == []
    assert verdict(_report(model_parallel_only())).word == "passed"


def test_blocked_is_not_applicable_but_a_violation_stands() -> None:
    base = model_parallel_only()
    blocker = FindingResult("F1", ["API-2"], "sig", "m", checks=["wrap_drawn"])
    blocked = one("wrap_drawn", ["WRAP-1"], "blocked", finding="F1", attributed_to=["API-2"])
    table = clause_outcomes([*base, blocked], [blocker])
    assert table["WRAP-1"][0] == "not applicable"
    assert table["API-2"][0] == "failed"  # the finding broke API-2, which does apply
    failing = one("wrap_bad", ["WRAP-1"], "failed", finding="F2", attributed_to=["WRAP-1"])
    found = FindingResult("F2", ["WRAP-1"], "sig2", "m", checks=["wrap_bad"])
    assert clause_outcomes([*base, failing], [found])["WRAP-1"][0] == "failed"


def test_the_outcome_is_a_clauses_only_and_conforms() -> None:
    kind = Outcome.NOT_APPLICABLE
    assert kind not in CHECK_OUTCOMES
    assert kind.conforms(whole_space=True) and not kind.fails_run and not kind.joins_finding
    assert not kind.counts_against_clause
    assert Outcome.ENVIRONMENT.severity < kind.severity < Outcome.PASSED.severity
    with pytest.raises(ValueError, match="not an outcome"):
        one("c", ["API-1"], "not applicable")


def test_every_writer_reads_not_applicable(tmp_path: Path) -> None:
    report = _report(model_parallel_only())
    files = write_report(report, tmp_path)
    data = json.loads(files.json.read_text())
    assert data["clauses"]["CFG-1"] == "not applicable"
    assert "not applicable" not in data["counts"]  # the checks' counts: no check has it
    assert "| CFG-1 | not applicable |" in files.markdown.read_text()
    summary = render_summary(report)
    assert "| CFG-1 | not applicable |" in summary
    assert "(it applies to no family the strategy offers)" in summary
    assert "o-idle" in files.html.read_text()
    config = SimpleNamespace(getoption=lambda name, default=None: None)
    lines = summary_lines(config, report)  # type: ignore[arg-type]
    assert (
        "  not applicable (5 clauses; the strategy offers only model_parallel): CFG-1, CFG-4, "
        "CFG-6, FSDP2-1, WRAP-1" in lines
    )
    assert not any(line.split()[:1] == ["CFG-1"] for line in lines)
