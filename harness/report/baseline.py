"""``python -m harness.report baseline REPORT_DIR``: an expected-failures file from a run.

The file is what ``--expected-failures`` reads: one ``CHECK_ID  reason`` line per check that
did not conform (its outcome fails the run, or it failed as listed: ``xfailed``), the reason
naming the clauses its finding broke and the finding's headline; one ``finding:CLAUSE  reason``
line per late finding (a violation recorded after its checks' properties, which fails no
check). A listed check that passed (a strict xpass: the run fails on it) is a fix, so it is
left out, as is one the strategy now declares ``unsupported`` or that needs another
``environment``: writing the baseline again takes their lines out.

A reason says the same thing in every run of an unchanged strategy, so a baseline written
again from such a run is the same file byte for byte: no finding numbers (they depend on what
else failed), no temporary directories, job numbers, addresses or durations
(:func:`steady`), and no earlier reason (a listed check's failure is the one it met, not
``expected failure: <the old reason>; ...``).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from harness.report.model import CheckResult, FindingResult, Report

__all__ = ["LATE_PREFIX", "baseline_lines", "render_baseline", "report_path", "steady"]

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
        if check.nonconforming
    ]
    late: dict[str, FindingResult] = {}
    for finding in report.findings:
        if finding.late:
            for clause in finding.clauses:
                late.setdefault(clause, finding)
    lines += [
        f"{LATE_PREFIX}{c}  late: {_one_line(_unprefixed(f.message, f.clauses))}"
        for c, f in late.items()
    ]
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
        why = _WHEN.sub("", check.own_failure().strip()) or "it did not conform"
        return _one_line(why)
    clauses = check.attributed_to or finding.clauses
    # a failure of another clause kept it from its property (its outcome is ``blocked``, or
    # ``xfailed`` when listed: the reason is the same either way)
    blocked = "blocked by " if not set(clauses) & set(check.clauses) else ""
    return f"{blocked}{', '.join(clauses)}: {_one_line(_unprefixed(finding.message, clauses))}"


#: what a failure outside the test's call starts with (not there once the check is listed)
_WHEN = re.compile(r"^(?:setup|teardown) failed: ")
#: a directory made for one run: pytest's (``pytest-of-USER/pytest-N``, or ``basetemp``; the
#: test's own below it, ``test_name0``, is kept), tempfile's (``tmpXXXXXXXX``), the harness
#: session's (``shardcheck-XXXXXXXX``) and its job directories (``jobs/job-N``)
_RUN_DIR = re.compile(r"pytest-of-.+|pytest-\d+|basetemp|tmp\w*|shardcheck-[\w-]+|jobs|job-\d+")
_PATH = re.compile(r"(?:/[^\s/'\"`:,;()\[\]{}<>]+)+/?")
_CHANGING = (
    (re.compile(r"\bjob \d+\b"), "job N"),
    (re.compile(r"\bpid \d+\b"), "pid N"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "0x?"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}:\d+\b"), "HOST:PORT"),
    (re.compile(r"\b\d+\.\d+ ?s\b"), "N s"),
)


def _steady_path(match: re.Match[str]) -> str:
    path = match.group(0)
    parts = path.split("/")
    marks = [i for i, part in enumerate(parts) if _RUN_DIR.fullmatch(part)]
    if not marks:
        root = tempfile.gettempdir().rstrip("/")
        if root and (path == root or path.startswith(root + "/")):
            return "<tmp>" + path[len(root) :]
        return path
    last = marks[-1]
    rest = "/".join(parts[last + 1 :])
    return f"<tmp>/{rest}" if rest else "<tmp>"


def steady(text: str) -> str:
    """``text`` with what changes from one run of the same strategy to the next masked: the
    run's temporary directories (pytest's, tempfile's, the harness' job directories) read
    ``<tmp>``; job numbers, pids, addresses, ports and durations in seconds read ``N``."""
    text = _PATH.sub(_steady_path, text)
    for pattern, replacement in _CHANGING:
        text = pattern.sub(replacement, text)
    return text


def _unprefixed(message: str, clauses: list[str]) -> str:
    """``message`` without the clause ids it starts with (the line names them already)."""
    first = message.strip()
    while any(first.startswith(f"{clause}: ") for clause in clauses):
        first = first.split(": ", 1)[1]
    return first


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(steady(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
