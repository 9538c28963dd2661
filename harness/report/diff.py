"""``python -m harness.report diff OLD NEW``: what changed between two runs.

The torch-upgrade question ("what did the new version break?") and the baseline's
("what did this pull request fix?"): the clauses whose outcome changed (with the checks that
moved), the clauses and checks that were added or removed, and

- what got worse: a check that fails now and did not fail (or fail as listed) before (it
  passed, was refused, or did not exist), a finding whose signature the old run did not
  have, a clause that some check tested before and none tests now (its checks became
  ``unsupported`` or ``environment``);
- what got fixed: a check that did not conform (it failed, or failed as listed) and passes
  now, a listed one included (its strict xpass fails the run, but it is a fix): its line
  comes out of the baseline;
- what went stale: a check that did not conform and is ``unsupported`` or ``environment``
  now: its line comes out of the baseline too, and the clauses it leaves without a check
  that ran are named (and are worse).

OLD and NEW are report.json files or the directories holding them. The command exits 1 when
something got worse (a CI gate), 0 otherwise (fixes alone included), and 2 when a file is not
a readable report.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.report.baseline import render_baseline, report_path
from harness.report.model import CheckResult, Report, ReportError, clause_outcomes, load_report
from harness.report.outcome import Outcome

__all__ = ["ReportDiff", "diff_reports", "format_diff", "main"]


@dataclass
class ReportDiff:
    """What changed between two reports, by clause and by check."""

    changed: list[tuple[str, str, str, list[tuple[str, str, str]]]]  # clause, old, new, checks
    clauses_added: list[tuple[str, str]]
    clauses_removed: list[tuple[str, str]]
    checks_added: list[tuple[str, str]]
    checks_removed: list[tuple[str, str]]
    findings_new: list[tuple[str, str]] = field(default_factory=list)  # (clauses, signature)
    findings_gone: list[tuple[str, str]] = field(default_factory=list)
    #: checks that fail now and did not before: (check, old outcome or "absent", new outcome)
    worse: list[tuple[str, str, str]] = field(default_factory=list)
    #: checks that did not conform and pass now (passed, or passed although listed)
    fixed: list[tuple[str, str, str]] = field(default_factory=list)
    #: checks that did not conform and are unsupported or environment now
    stale: list[tuple[str, str, str]] = field(default_factory=list)
    #: clauses a check tested before and none tests now: (clause, the checks refused now)
    uncovered: list[tuple[str, list[str]]] = field(default_factory=list)

    @property
    def got_worse(self) -> bool:
        """True when a check fails that did not, a finding is new, or a clause lost every
        check that tested it: the gate's answer."""
        return bool(self.worse or self.findings_new or self.uncovered)

    @property
    def empty(self) -> bool:
        """True when no clause outcome changed, no clause or check came or went, and nothing
        was fixed or went stale."""
        return not (
            self.changed
            or self.clauses_added
            or self.clauses_removed
            or self.checks_added
            or self.checks_removed
            or self.findings_new
            or self.findings_gone
            or self.fixed
            or self.stale
            or self.uncovered
        )


def _word(check: CheckResult | None) -> str:
    """A check's outcome as the diff prints it (``passed (listed)`` for a fixed check)."""
    if check is None:
        return "absent"
    return "passed (listed)" if check.fixed else check.outcome


def _tested(check: CheckResult) -> bool:
    """Whether the check tested its clauses' properties (it ran: passed or failed)."""
    return not Outcome(check.outcome).did_not_run


_REFUSED = (Outcome.UNSUPPORTED, Outcome.ENVIRONMENT)


def _uncovered(old: Report, new: Report) -> list[tuple[str, list[str]]]:
    """Clauses of both runs that a check tested in ``old`` and none tests in ``new``,
    because a check that tested them is ``unsupported`` or ``environment`` now."""
    was = {c.id: c for c in old.checks}
    by_clause: dict[str, list[CheckResult]] = {}
    for check in new.checks:
        for clause in check.clauses:
            by_clause.setdefault(clause, []).append(check)
    tested_before = {cl for c in old.checks if _tested(c) for cl in c.clauses}
    lost = []
    for clause, members in sorted(by_clause.items()):
        if clause not in tested_before or any(_tested(c) for c in members):
            continue
        refused = [
            c.id for c in members if c.outcome in _REFUSED and c.id in was and _tested(was[c.id])
        ]
        if refused:
            lost.append((clause, refused))
    return lost


def diff_reports(old: Report, new: Report) -> ReportDiff:
    """Compare two reports: clause outcomes that changed, clauses and checks added/removed,
    and the checks that got worse, were fixed or went stale."""
    old_clauses = clause_outcomes(old.checks, old.findings)
    new_clauses = clause_outcomes(new.checks, new.findings)
    was_found = {f.signature for f in old.findings}
    now_found = {f.signature for f in new.findings}
    old_checks = {c.id: c for c in old.checks}
    new_checks = {c.id: c for c in new.checks}
    changed = []
    for clause in sorted(old_clauses.keys() & new_clauses.keys()):
        (was, old_members), (now, new_members) = old_clauses[clause], new_clauses[clause]
        if was == now:
            continue
        before = {c.id: _word(c) for c in old_members}
        after = {c.id: _word(c) for c in new_members}
        moved = [
            (cid, before.get(cid, "absent"), after.get(cid, "absent"))
            for cid in sorted(before.keys() | after.keys())
            if before.get(cid) != after.get(cid)
        ]
        changed.append((clause, was, now, moved))
    listed = set(new.expected_failures.get("listed", []))
    worse, fixed, stale = [], [], []
    for cid, check in new_checks.items():
        earlier = old_checks.get(cid)
        did_not_conform = earlier is not None and earlier.nonconforming
        row = (cid, _word(earlier), _word(check))
        if Outcome(check.outcome).fails_run and not check.fixed and not did_not_conform:
            worse.append(row)
        elif did_not_conform and (check.fixed or check.outcome == Outcome.PASSED):
            fixed.append(row)
        elif (did_not_conform or cid in listed) and check.outcome in _REFUSED:
            stale.append(row)
        elif check.fixed and not did_not_conform:  # listed, and it passed before too
            fixed.append(row)
    return ReportDiff(
        worse=worse,
        fixed=fixed,
        stale=stale,
        uncovered=_uncovered(old, new),
        changed=changed,
        clauses_added=[(c, new_clauses[c][0]) for c in sorted(new_clauses.keys() - old_clauses)],
        clauses_removed=[(c, old_clauses[c][0]) for c in sorted(old_clauses.keys() - new_clauses)],
        checks_added=[(i, new_checks[i].outcome) for i in sorted(new_checks.keys() - old_checks)],
        checks_removed=[(i, old_checks[i].outcome) for i in sorted(old_checks.keys() - new_checks)],
        findings_new=[
            (", ".join(f.clauses), f.signature)
            for f in new.findings
            if f.signature not in was_found
        ],
        findings_gone=[
            (", ".join(f.clauses), f.signature)
            for f in old.findings
            if f.signature not in now_found
        ],
    )


def _describe(report: Report, path: str) -> str:
    env = report.environment
    return (
        f"{path} (shardcheck {report.suite_version}, torch {env.get('torch')}, "
        f"strategy {report.strategy.get('factory')})"
    )


def format_diff(diff: ReportDiff, old: Report, new: Report, old_path: str, new_path: str) -> str:
    """The text ``python -m harness.report diff`` prints."""
    lines = [f"old: {_describe(old, old_path)}", f"new: {_describe(new, new_path)}", ""]
    if diff.empty:
        return "\n".join([*lines, "no change: every clause has the same outcome and checks."])
    if diff.got_worse:
        untested = f", {len(diff.uncovered)} clauses no check tests now" if diff.uncovered else ""
        lines.append(
            f"worse: {len(diff.worse)} checks fail that did not, "
            f"{len(diff.findings_new)} new findings{untested}"
        )
        lines += [f"  {cid}: {was} -> {now}" for cid, was, now in diff.worse]
        lines += [
            f"  {clause}: no check tests it now ({', '.join(ids)} refused now)"
            for clause, ids in diff.uncovered
        ]
    else:
        lines.append("not worse: no check fails that did not, no finding is new")
    if diff.fixed:
        lines.append(
            f"fixed: {len(diff.fixed)} listed checks now pass, remove them from the baseline"
        )
        lines += [f"  {cid}: {was} -> {now}" for cid, was, now in diff.fixed]
    if diff.stale:
        lines.append(
            f"stale: {len(diff.stale)} listed checks are unsupported or environment now, "
            "remove them from the baseline"
        )
        lost: dict[str, list[str]] = {}
        for clause, ids in diff.uncovered:
            for cid in ids:
                lost.setdefault(cid, []).append(clause)
        for cid, was, now in diff.stale:
            cost = f" ({', '.join(lost[cid])}: no check that ran now)" if cid in lost else ""
            lines.append(f"  {cid}: {was} -> {now}{cost}")
    lines.append(f"clauses whose outcome changed: {len(diff.changed)}")
    for clause, was, now, moved in diff.changed:
        lines.append(f"  {clause}: {was} -> {now}")
        lines += [f"      {cid}: {a} -> {b}" for cid, a, b in moved]
    for title, rows in (
        ("clauses added", diff.clauses_added),
        ("clauses removed", diff.clauses_removed),
        ("checks added", diff.checks_added),
        ("checks removed", diff.checks_removed),
        ("findings new (by signature)", diff.findings_new),
        ("findings gone (by signature)", diff.findings_gone),
    ):
        if title.startswith("findings") and not rows:
            continue  # reports without findings (or of schema 1) read as before
        lines.append(f"{title}: {len(rows)}")
        lines += [f"  {name} ({outcome})" for name, outcome in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.report diff OLD NEW`` (1 when something got worse, else 0) and
    ``python -m harness.report baseline REPORT_DIR`` (0); 2 on a file that is no report."""
    parser = argparse.ArgumentParser(
        prog="python -m harness.report", description="Work with shardcheck conformance reports."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    diff = commands.add_parser(
        "diff", help="what changed between two runs; exits 1 when something got worse"
    )
    diff.add_argument("old", help="the earlier report.json (or its directory)")
    diff.add_argument("new", help="the later report.json (or its directory)")
    base = commands.add_parser(
        "baseline", help="write an --expected-failures file from a run's report"
    )
    base.add_argument("report", help="the run's report directory (or its report.json)")
    base.add_argument(
        "-o",
        "--output",
        help="the file to write (default: REPORT_DIR/expected-failures.txt; '-': stdout)",
    )
    args = parser.parse_args(argv)
    if args.command == "baseline":
        return _baseline(args.report, args.output)
    try:
        old, new = load_report(report_path(args.old)), load_report(report_path(args.new))
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    changes = diff_reports(old, new)
    print(format_diff(changes, old, new, args.old, args.new))
    return 1 if changes.got_worse else 0


def _baseline(source: str, output: str | None) -> int:
    path = report_path(source)
    try:
        report = load_report(path)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = render_baseline(report, str(path))
    if output == "-":
        print(text, end="")
        return 0
    target = Path(output) if output else path.parent / "expected-failures.txt"
    target.write_text(text)
    count = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    print(f"wrote {target}: {count} expected failures (pass it with --expected-failures)")
    return 0
