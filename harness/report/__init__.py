"""The conformance report: its model, its writers (``report.json``, ``report.md``,
``summary.md``, ``report.html``), and ``diff``.

A report lists every check that was collected (none is dropped: a check that was deselected
is listed under ``selection``), each with its outcome, and groups them by the CONTRACT.md clauses
they declare. :class:`Outcome` (``outcome.py``) says which outcomes fail the run, join a
finding and count against a clause; every writer asks it. A clause takes the worst outcome of
its checks, where a check the strategy declared unsupported, or one that needs another
environment, does not count against one that passed (see ``nonconforming``); a clause and
its family cells agree by the one rule of [Note: one meaning in the clause table] in
``model.py``.

``python -m harness.report diff OLD.json NEW.json`` answers "what did this change break, and
what did it fix?"; ``python -m harness.report baseline REPORT_DIR`` writes the
expected-failures file of a run (``baseline.py``).
"""

from __future__ import annotations

from harness.report.diff import ReportDiff, diff_reports, format_diff, main
from harness.report.html import render_html
from harness.report.markdown import render_markdown
from harness.report.model import (
    BLOCKED,
    CONFORMING,
    NO_CLAUSE,
    NOT_APPLICABLE,
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
    declared_unsupported,
    load_report,
    nonconforming,
    offered_outcome,
    refused_families,
    worst_outcome,
)
from harness.report.outcome import Outcome
from harness.report.summary import SUMMARY_LIMIT, render_summary
from harness.report.verdict import Verdict, verdict
from harness.report.write import ReportFiles, write_report

__all__ = [
    "BLOCKED",
    "CONFORMING",
    "NOT_APPLICABLE",
    "NOT_RUN",
    "NO_CLAUSE",
    "OUTCOMES",
    "READABLE_SCHEMAS",
    "SCHEMA_VERSION",
    "SEVERITY",
    "SUMMARY_LIMIT",
    "CheckResult",
    "FindingResult",
    "Outcome",
    "Report",
    "ReportDiff",
    "ReportError",
    "ReportFiles",
    "Verdict",
    "clause_family_outcomes",
    "clause_outcomes",
    "declared_unsupported",
    "diff_reports",
    "format_diff",
    "load_report",
    "main",
    "nonconforming",
    "offered_outcome",
    "refused_families",
    "render_html",
    "render_markdown",
    "render_summary",
    "verdict",
    "worst_outcome",
    "write_report",
]
