"""``python -m harness.report baseline REPORT_DIR``: an expected-failures file from a run.

The file is what ``--expected-failures`` reads: one ``CHECK_ID  reason`` line per check that
did not conform (its outcome fails the run, or it was already an expected failure), the
reason naming its finding, the clauses it broke and the finding's headline; one
``finding:CLAUSE  reason`` line per late finding (a violation recorded after its checks'
properties, which fails no check). A later run given the file is green while the strategy
fails exactly as it did, and red when a listed check passes or an unlisted one fails.
"""

from __future__ import annotations

from pathlib import Path

from harness.report.model import CheckResult, FindingResult, Report
from harness.report.outcome import Outcome

__all__ = ["LATE_PREFIX", "baseline_lines", "render_baseline", "report_path"]

#: the expected-failures prefix of a late finding's line (``finding:API-8``)
LATE_PREFIX = "finding:"


def report_path(path: str | Path) -> Path:
    """``path`` itself for a file, ``path/report.json`` for a report directory."""
    given = Path(path)
    return given / "report.json" if given.is_dir() else given


def baseline_lines(report: Report) -> list[str]:
    """The ``CHECK_ID  reason`` and ``finding:CLAUSE  reason`` lines for ``report``, in the
    report's order (checks, then late findings)."""
    findings = {f.id: f for f in report.findings}
    lines = [
        f"{check.id}  {_reason(check, findings.get(check.finding or ''))}"
        for check in report.checks
        if Outcome(check.outcome).is_failure
    ]
    late: dict[str, FindingResult] = {}
    for finding in report.findings:
        if finding.late:
            for clause in finding.clauses:
                late.setdefault(clause, finding)
    lines += [f"{LATE_PREFIX}{c}  {f.id}, late: {_one_line(f.message)}" for c, f in late.items()]
    return lines


def render_baseline(report: Report, source: str) -> str:
    """The whole file: a header saying where it came from, then :func:`baseline_lines`."""
    env = report.environment
    header = [
        f"# expected failures of {report.strategy.get('factory', 'the strategy')}, written by",
        f"# `python -m harness.report baseline` from {source}",
        f"# (shardcheck {report.suite_version}, torch {env.get('torch')}). One CHECK_ID and its",
        "# reason per line; pass the file to pytest with --expected-failures.",
    ]
    lines = baseline_lines(report)
    if not lines:
        header.append("# every check conformed: nothing is expected to fail")
    return "\n".join([*header, *lines]) + "\n"


def _reason(check: CheckResult, finding: FindingResult | None) -> str:
    if finding is None:
        why = check.failure or "it did not conform"
        return f"{check.outcome}: {_one_line(why)}"
    clauses = ", ".join(check.attributed_to or finding.clauses)
    return f"{finding.id} ({clauses}, {check.outcome}): {_one_line(finding.message)}"


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
