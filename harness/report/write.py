"""Writing a report: ``report.json`` (the model's document) and its renderings beside it.

``report.md`` (everything, in Markdown), ``summary.md`` (short, for a PR comment or
``$GITHUB_STEP_SUMMARY``) and ``report.html`` (one page for a browser). Kept apart from
:mod:`harness.report.model` so that the model knows nothing of its renderings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from harness.report.html import render_html
from harness.report.markdown import render_markdown
from harness.report.model import Report
from harness.report.summary import render_summary

__all__ = ["ReportFiles", "write_report"]


class ReportFiles(NamedTuple):
    """The files :func:`write_report` wrote."""

    json: Path
    markdown: Path
    summary: Path
    html: Path


def write_report(report: Report, directory: str | Path) -> ReportFiles:
    """Write ``report.json``, ``report.md``, ``summary.md`` and ``report.html`` into
    ``directory`` (created if missing).

    Returns:
        Their paths.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(
        out / "report.json", out / "report.md", out / "summary.md", out / "report.html"
    )
    files.json.write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    files.markdown.write_text(render_markdown(report))
    files.summary.write_text(render_summary(report))
    files.html.write_text(render_html(report))
    return files
