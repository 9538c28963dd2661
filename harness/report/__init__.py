"""The conformance report: its model, the ``report.json``/``report.md`` writers, and ``diff``.

A report lists every check that was collected (none is dropped: a check that was deselected
is listed under ``selection``), each with its outcome, and groups them by the CONTRACT.md clauses
they declare. A clause takes the worst outcome of its checks.

``python -m harness.report diff OLD.json NEW.json`` answers "what did this change break?":
it lists the clauses whose outcome changed, and the checks that were added or removed.
"""

from __future__ import annotations

from harness.report.diff import ReportDiff, diff_reports, format_diff, main
from harness.report.markdown import render_markdown
from harness.report.model import (
    BLOCKED,
    CONFORMING,
    NO_CLAUSE,
    NOT_RUN,
    OUTCOMES,
    READABLE_SCHEMAS,
    SCHEMA_VERSION,
    SEVERITY,
    CheckResult,
    FindingResult,
    Report,
    ReportError,
    clause_family_outcomes,
    clause_outcomes,
    load_report,
    worst_outcome,
)
from harness.report.write import write_report

__all__ = [
    "BLOCKED",
    "CONFORMING",
    "NOT_RUN",
    "NO_CLAUSE",
    "OUTCOMES",
    "READABLE_SCHEMAS",
    "SCHEMA_VERSION",
    "SEVERITY",
    "CheckResult",
    "FindingResult",
    "Report",
    "ReportDiff",
    "ReportError",
    "clause_family_outcomes",
    "clause_outcomes",
    "diff_reports",
    "format_diff",
    "load_report",
    "main",
    "render_markdown",
    "worst_outcome",
    "write_report",
]
