"""Writing a report: ``report.json`` (the model's document) and ``report.md`` beside it.

Kept apart from :mod:`harness.report.model` so that the model knows nothing of its renderings:
:mod:`harness.report.markdown` reads the model, this module uses both.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.report.markdown import render_markdown
from harness.report.model import Report

__all__ = ["write_report"]


def write_report(report: Report, directory: str | Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` into ``directory`` (created if missing).

    Returns:
        The paths of ``report.json`` and ``report.md``.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    md_path.write_text(render_markdown(report))
    return json_path, md_path
