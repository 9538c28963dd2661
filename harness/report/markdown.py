"""``report.md``: counts per outcome, the clause table, the coverage, the cost, failures with
reproducers."""

from __future__ import annotations

from typing import Any

from harness.clauses import CLAUSES
from harness.report.cost import (
    FOOTPRINT,
    categories,
    collectives_text,
    configuration_row,
    footprint,
    human_bytes,
)
from harness.report.model import (
    NO_CLAUSE,
    CheckResult,
    Report,
    clause_family_outcomes,
    clause_outcomes,
)
from harness.report.outcome import Outcome

__all__ = ["render_markdown"]


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _fence(text: str) -> str:
    ticks = "````" if "```" in text else "```"
    return f"{ticks}\n{text.rstrip()}\n{ticks}"


def _header_lines(report: Report) -> list[str]:
    counts = report.counts()
    clauses = clause_outcomes(report.checks)
    env, strategy = report.environment, report.strategy
    sizes = ", ".join(str(s) for s in env.get("world_sizes", [])) or "none"
    lines = [
        "# shardcheck conformance report",
        "",
        "**" + " · ".join(f"{n} {o}" for o, n in counts.items()) + "**"
        f" ({len(report.checks)} checks, {len([c for c in clauses if c != NO_CLAUSE])} clauses)",
        "",
        f"- suite: shardcheck {report.suite_version} (report schema {report.schema_version})",
        f"- strategy: `{strategy.get('factory')}` options `{strategy.get('options', {})}`",
        f"- environment: torch {env.get('torch')}, Python {env.get('python')}, backend "
        f"{env.get('backend')}, device {env.get('device')}, world sizes {sizes}",
    ]
    deselected = report.selection.get("deselected", [])
    if report.selection.get("clauses") or deselected:
        lines.append(
            f"- selection: --clauses {report.selection.get('clauses') or '(all)'}; "
            f"{len(deselected)} checks deselected (listed in report.json)"
        )
    unmatched = report.expected_failures.get("unmatched", [])
    if report.expected_failures.get("file"):
        lines.append(
            f"- expected failures: `{report.expected_failures['file']}`"
            + (f"; ids matching no test: {', '.join(unmatched)}" if unmatched else "")
        )
    lines += ["", "| outcome | checks |", "|---|---|"]
    lines += [f"| {o} | {n} |" for o, n in counts.items()]
    return lines


def _clause_texts(failures: list[CheckResult]) -> list[str]:
    """What each clause named by a failure requires, in contract order (ids the contract does
    not have, from a third party's own suite, are listed without a text)."""
    named = {c for check in failures for c in check.clauses}
    if not named:
        return []
    ordered = [c for c in CLAUSES if c in named] + sorted(named - set(CLAUSES))
    lines = ["", "## What the failing clauses require", ""]
    for clause in ordered:
        text = CLAUSES[clause].text if clause in CLAUSES else "(not a clause of CONTRACT.md)"
        lines.append(f"- **{clause}**: {text}")
    return lines


def _finding_lines(report: Report) -> list[str]:
    """The findings, one root cause each: clauses and their text, where, example, reproducer."""
    if not report.findings:
        return []
    first = min(f.found_after_s for f in report.findings)
    lines = ["", f"## {len(report.findings)} findings (first failure after {first:.1f} s)", ""]
    lines += ["| finding | clauses | checks | message |", "|---|---|---|---|"]
    for f in report.findings:
        row = (f.id, ", ".join(f.clauses), len(f.checks), f.message)
        lines.append("| " + " | ".join(_cell(x) for x in row) + " |")
    for f in report.findings:
        lines += ["", f"### {f.id}: {', '.join(f.clauses)}", ""]
        for clause in f.clauses:
            text = CLAUSES[clause].text if clause in CLAUSES else "(not a clause of CONTRACT.md)"
            lines.append(f"- **{clause}** requires: {text}")
        if f.late:
            lines.append(
                "- recorded after the checks' properties were tested: their verdicts stand"
            )
        lines.append(f"- message: {_cell(f.message)}")
        if f.where:
            lines.append(f"- where: `{f.where}`")
        if f.raised_in:
            lines.append(f"- raised in: `{f.raised_in}`")
        lines.append(f"- signature: `{f.signature}`")
        lines.append(f"- checks ({len(f.checks)}): {', '.join(f.checks)}")
        if f.example:
            lines += ["", _fence(f.example)]
        if f.reproduce:
            lines += ["", "Reproduce:", "", _fence(f.reproduce)]
    return lines


def coverage_line(coverage: dict[str, Any]) -> str:
    """The one-line coverage figure (``""`` when no job reported its axes)."""
    if not coverage:
        return ""
    line = (
        f"pairs of configuration values covered: {coverage['pairs_covered']} of "
        f"{coverage['pairs_supported']} supported (exercised by a passing check / reached "
        "the ranks at all)"
    )
    declared = coverage.get("pairs_declared", 0)
    if declared:
        line += (
            f"; {declared} pairs in the suites' configuration space, "
            f"{coverage.get('never_reached_count', 0)} never reached"
        )
    return line


def clause_coverage_line(coverage: dict[str, Any]) -> str:
    """The per-clause figure: (clause, axis value) pairs covered of those reached."""
    table = coverage.get("by_clause", {}) if coverage else {}
    if not table:
        return ""
    covered = sum(len(a["covered"]) for row in table.values() for a in row.values())
    reached = sum(len(a["reached"]) for row in table.values() for a in row.values())
    return (
        f"(clause, axis value) pairs covered: {covered} of {reached} reached ({len(table)} clauses)"
    )


def _clause_coverage_lines(coverage: dict[str, Any]) -> list[str]:
    table = coverage.get("by_clause", {})
    if not table:
        return []
    lines = [
        "",
        "### Coverage per clause",
        "",
        clause_coverage_line(coverage) + ". Per clause: the axis values a passing check of the "
        "clause exercised, of those that reached its checks; values that reached it only in "
        "checks that did not pass; and values of the suites' configuration space inside the "
        "clause's scope (a family, a precision: see `harness/clauses`) its checks never drew, "
        "on the axes they report.",
        "",
        "| clause | covered | reached, not covered | never reached |",
        "|---|---|---|---|",
    ]
    for clause, row in table.items():
        covered = sum(len(a["covered"]) for a in row.values())
        reached = sum(len(a["reached"]) for a in row.values())
        gaps = "; ".join(
            f"{axis}: {', '.join(v for v in a['reached'] if v not in a['covered'])}"
            for axis, a in row.items()
            if len(a["covered"]) < len(a["reached"])
        )
        never = "; ".join(
            f"{axis}: {', '.join(a['never'])}" for axis, a in row.items() if a.get("never")
        )
        lines.append(f"| {clause} | {covered} of {reached} | {_cell(gaps)} | {_cell(never)} |")
    return lines


def _coverage_lines(coverage: dict[str, Any]) -> list[str]:
    if not coverage:
        return []
    lines = ["", "## Configuration coverage", "", coverage_line(coverage) + ".", ""]
    lines += ["| axis | values exercised |", "|---|---|"]
    lines += [f"| {axis} | {_cell(', '.join(v))} |" for axis, v in coverage["values"].items()]
    lines += ["", "| axes | covered | supported | not covered |", "|---|---|---|---|"]
    for row in coverage["by_axes"]:
        gap = row["supported"] - row["covered"]
        missing = ", ".join(f"{a} x {b}" for a, b in row["missing"])
        if gap > len(row["missing"]):
            missing += f" (+{gap - len(row['missing'])} more)"
        axes = " x ".join(row["axes"])
        lines.append(f"| {axes} | {row['covered']} | {row['supported']} | {_cell(missing)} |")
    if coverage.get("never_reached_count"):
        shown = ", ".join(f"{a}={va} x {b}={vb}" for a, va, b, vb in coverage["never_reached"])
        more = coverage["never_reached_count"] - len(coverage["never_reached"])
        lines += [
            "",
            f"Pairs of the configuration space no job reached: {shown}"
            + (f" (+{more} more)" if more > 0 else "")
            + ".",
        ]
    return lines + _clause_coverage_lines(coverage)


def _categories_text(row: dict[str, int]) -> str:
    """``104 KiB (params 34.5 KiB, optimizer 69.2 KiB)``: the total, then each category that
    holds bytes."""
    parts = [f"{c} {human_bytes(row[c])}" for c in categories([row]) if c != "total"]
    total = human_bytes(row.get("total", 0))
    return f"{total} ({', '.join(parts)})" if parts else total


def _family_cost_lines(name: str, family: dict[str, Any]) -> list[str]:
    series = family.get("series", [])
    plain = family.get("plain", {})
    rest = categories([p["at_rest"] for p in series] + [{k: plain.get(k, 0) for k in FOOTPRINT}])
    peak = categories(p["peak"] for p in series)
    blank_peak = " |" * len(peak)
    law = family.get("projection", {})
    lines = ["", f"### {name}", ""]
    if law:
        worlds = ", ".join(str(w) for w in law.get("measured_worlds", []))
        lines += [
            f"Projection: {human_bytes(law['fixed'])} fixed + {human_bytes(law['sharded'])} / "
            f"world ({law['fixed']} + {law['sharded']} / world bytes), fitted by least squares "
            f"to world sizes {worlds}; {law.get('note', 'not measured')}.",
            "",
        ]
    lines += [
        "| world size | configuration | "
        + "".join(f"at rest: {c} | " for c in rest)
        + "".join(f"peak: {c} | " for c in peak)
        + "collectives per step |",
        "|---|---|" + "---:|" * (len(rest) + len(peak)) + "---|",
    ]
    if plain:
        cells = "".join(
            f"{human_bytes(footprint(plain) if c == 'total' else plain.get(c, 0))} | "
            if c in (*FOOTPRINT, "total")
            else " |"
            for c in rest
        )
        lines.append(
            f"| - | plain model: params + grads + optimizer, one process | {cells}{blank_peak} |"
        )
    for p in series:
        lines.append(
            f"| {p['world_size']} | {_cell(p['configuration'])} | "
            + "".join(f"{human_bytes(p['at_rest'].get(c, 0))} | " for c in rest)
            + "".join(f"{human_bytes(p['peak'].get(c, 0))} | " for c in peak)
            + f"{collectives_text(p['collectives'])} |"
        )
    for world, total in law.get("at", {}).items():
        blank_rest = " |" * (len(rest) - 1)
        lines.append(
            f"| {world} (projected) | projection: fixed + sharded / world, not measured |"
            f"{blank_rest} {human_bytes(total)} |{blank_peak} |"
        )
    return lines


def _configuration_lines(configurations: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "### Every configuration measured",
        "",
        "The largest rank's bytes, unless a column says otherwise; collectives are rank 0's, "
        "by phase (`accumulate`: the micro-batches inside `no_backward_sync`; `step`: the "
        "synchronized micro-batch).",
        "",
        "| configuration | family | world size | at rest, each rank | at rest | peak of the step "
        "| collectives by phase | full save peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for measured in configurations:
        row = configuration_row(measured)
        phases = "; ".join(
            f"{phase}: {collectives_text(kinds)}" for phase, kinds in row["collectives"].items()
        )
        save = "-" if row["save_peak"] is None else human_bytes(row["save_peak"])
        lines.append(
            f"| {_cell(row['configuration'])} | {row['family']} | {row['world_size']} | "
            + ", ".join(human_bytes(b) for b in row["at_rest_per_rank"])
            + f" | {_categories_text(row['at_rest'])} | {_categories_text(row['peak'])} | "
            f"{_cell(phases or 'none')} | {save} |"
        )
    return lines


def _cost_lines(cost: dict[str, Any]) -> list[str]:
    families = cost.get("families", {}) if cost else {}
    if not families:
        return []
    lines = [
        "",
        "## Cost",
        "",
        "Bytes per rank (KiB and MiB are 1024 and 1024² bytes; report.json's `cost` has the "
        "exact figures). Per family, its main configuration at each world size: the largest "
        "rank's bytes at rest after the optimizer step and at the step's peak, by category, and "
        "the collectives of the synchronized micro-batch, count and bytes by kind; the plain "
        "model's row is what one process holds to train it unsharded. Projected rows are not "
        "measured: they extend `bytes = fixed + sharded / world`, fitted to the measured sizes.",
    ]
    for name, family in families.items():
        lines += _family_cost_lines(name, family)
    return lines + _configuration_lines(cost.get("configurations", []))


def render_markdown(report: Report) -> str:
    """``report.md``: counts, the findings, the clause table (by family where checks name
    one), the configuration coverage, the cost, failures, then checks not run."""
    lines = _header_lines(report)
    lines += _finding_lines(report)
    by_family = clause_family_outcomes(report.checks, report.findings)
    families = sorted({f for outcomes in by_family.values() for f in outcomes})
    lines += [
        "",
        "## Clauses",
        "",
        "| clause | outcome | " + "".join(f"{f} | " for f in families) + "checks | not passed |",
        "|---|---|" + "---|" * len(families) + "---|---|",
    ]
    for clause, (outcome, members) in clause_outcomes(report.checks, report.findings).items():
        bad = [
            f"{c.id} ({c.clause_outcome(clause)})"
            for c in members
            if c.clause_outcome(clause) != "passed"
        ]
        split = "".join(f"{by_family.get(clause, {}).get(f, '-')} | " for f in families)
        lines.append(f"| {clause} | {outcome} | {split}{len(members)} | {_cell(', '.join(bad))} |")
    lines += _coverage_lines(report.coverage)
    lines += _cost_lines(report.cost)
    failures = [c for c in report.checks if Outcome(c.outcome).is_failure]
    lines += ["", "## Failures", ""]
    if not failures:
        lines.append("None.")
    for check in failures:
        clauses = ", ".join(check.clauses) or NO_CLAUSE
        finding = f", finding {check.finding}" if check.finding else ""
        lines += [f"### {check.id}: {check.outcome} ({clauses}{finding})", ""]
        lines += [_fence(check.failure or "(no message)"), "", "Reproduce:", ""]
        lines += [_fence(check.reproducer), ""]
    lines += _clause_texts(failures)
    not_run = [c for c in report.checks if Outcome(c.outcome).did_not_run]
    if not_run:
        lines += ["", "## Checks that did not run (unsupported, environment, not run)", ""]
        lines += ["| check | clauses | outcome | reason |", "|---|---|---|---|"]
        for check in not_run:
            row = (check.id, ", ".join(check.clauses), check.outcome, check.failure or "")
            lines.append("| " + " | ".join(_cell(x) for x in row) + " |")
    return "\n".join(lines).rstrip() + "\n"
