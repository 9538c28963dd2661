"""Combine the data files of every process of a rank-coverage run and write the reports.

Each measured process (the controller and every rank, respawned ones included) leaves one
``.coverage.<role>.pid<PID>.<random>`` file in the run's directory. :func:`combine_and_report`
merges them into ``DIR/.coverage`` (readable by ``coverage html --data-file DIR/.coverage``)
and writes ``DIR/coverage.txt`` (coverage's table with missing lines and branches) and
``DIR/coverage.json`` (coverage's JSON report: per-file executed, missing and partial lines).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CoverageSummary", "clear_data", "combine_and_report"]


@dataclass(frozen=True)
class CoverageSummary:
    """The combined figures of one run.

    Args:
        sources: the measured package or module names.
        report_dir: where the reports are.
        processes: data files combined, one per measured process.
        rank_processes: how many of them are rank processes.
        line_percent: covered statements / statements, in percent (None: nothing measured).
        branch_percent: covered branches / branches, in percent (None: no branches).
        missing: per measured file (relative path), its missing line numbers.
    """

    sources: tuple[str, ...]
    report_dir: str
    processes: int
    rank_processes: int
    line_percent: float | None
    branch_percent: float | None
    missing: dict[str, list[int]] = field(default_factory=dict)

    def line(self) -> str:
        """The one-line terminal summary."""
        what = ", ".join(self.sources)
        if self.line_percent is None:
            return (
                f"rank coverage of {what}: no data collected ({self.processes} data files); "
                f"report: {_shown(self.report_dir)}"
            )
        branches = "n/a" if self.branch_percent is None else f"{self.branch_percent:.1f}%"
        controller = self.processes - self.rank_processes
        return (
            f"rank coverage of {what}: {self.line_percent:.1f}% lines, {branches} branches, "
            f"{self.processes} processes combined ({self.rank_processes} ranks, "
            f"{controller} controller); report: {_shown(self.report_dir)}"
        )


def _shown(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _data_files(report_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(glob.escape(report_dir), ".coverage.*")))


def clear_data(report_dir: str) -> None:
    """Remove a previous run's data files and reports from ``report_dir``."""
    names = [".coverage", "coverage.txt", "coverage.json"]
    for path in [*_data_files(report_dir), *(os.path.join(report_dir, n) for n in names)]:
        if os.path.isfile(path):
            os.remove(path)


def _percent(covered: int, total: int) -> float | None:
    return 100.0 * covered / total if total else None


def combine_and_report(
    report_dir: str, sources: Sequence[str], branch: bool = True
) -> CoverageSummary:
    """Combine every process's data file in ``report_dir`` and write the reports there.

    Args:
        report_dir: the run's directory (holds the per-process data files).
        sources: the measured names (for the summary line).
        branch: the data was measured with branch coverage.

    Returns:
        The summary; ``line_percent`` is None when no process recorded anything.
    """
    import coverage

    files = _data_files(report_dir)
    ranks = sum(1 for f in files if os.path.basename(f).startswith(".coverage.rank"))
    combined = os.path.join(report_dir, ".coverage")
    if os.path.exists(combined):
        os.remove(combined)
    cov = coverage.Coverage(data_file=combined, branch=branch, config_file=False)
    cov.set_option("run:disable_warnings", ["no-data-collected"])
    empty = CoverageSummary(tuple(sources), report_dir, len(files), ranks, None, None)
    if not files:
        return empty
    cov.combine([report_dir], keep=False)
    cov.save()
    json_path = os.path.join(report_dir, "coverage.json")
    try:
        cov.json_report(outfile=json_path)
    except coverage.exceptions.NoDataError:
        return empty
    with open(json_path) as f:
        report = json.load(f)
    totals = report["totals"]
    summary = CoverageSummary(
        tuple(sources),
        report_dir,
        len(files),
        ranks,
        _percent(totals["covered_lines"], totals["num_statements"]),
        _percent(totals.get("covered_branches", 0), totals.get("num_branches", 0)),
        {name: list(data["missing_lines"]) for name, data in report["files"].items()},
    )
    with open(os.path.join(report_dir, "coverage.txt"), "w") as f:
        f.write(summary.line() + "\n\n")
        cov.report(file=f, show_missing=True)
    return summary
