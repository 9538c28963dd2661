"""``summary.md``: the run in short, for a PR comment or ``$GITHUB_STEP_SUMMARY``.

A PR comment or a job summary takes at most 64 KiB, so the summary never exceeds
:data:`SUMMARY_LIMIT` bytes (UTF-8), whatever the run: the verdict, the counts, one line per
finding (clause, what, first check, how many checks it explains), the clauses that did not
pass (one line each) and those that passed (one line in all), the cost when cost checks ran
(per family, bytes per rank at rest by world size, the plain model's and the projection), and
where the full report is.
Every line is clipped; when the whole would still be too long, each list is cut to the same
number of rows, the most that fits, and ends with ``... and N more``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from harness.report.cost import PROJECTED_WORLDS, footprint, human_bytes
from harness.report.markdown import coverage_line
from harness.report.model import (
    NO_CLAUSE,
    Report,
    against,
    clause_family_outcomes,
    clause_outcomes,
    environment_note,
)
from harness.report.verdict import verdict
from harness.report.words import shorten

__all__ = ["SUMMARY_LIMIT", "render_summary"]

#: the most bytes ``summary.md`` takes: under GitHub's 65,536 characters with room to spare
SUMMARY_LIMIT = 60_000
_TEXT = 160  # the most characters of a message or a check id in a cell
_LINE = 400  # the most characters of a header line


def _clip(text: object, limit: int) -> str:
    return shorten(" ".join(str(text).split()), limit)


def _code(text: str, limit: int = _TEXT) -> str:
    """``text`` as a code span in a table cell: no HTML or Markdown inside, pipes escaped."""
    text = _clip(text, limit).replace("|", "\\|")
    if not text:
        return ""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _rows(lines: Sequence[str], shown: int | None, what: str) -> list[str]:
    if shown is None or len(lines) <= shown:
        return list(lines)
    return [*lines[:shown], f"... and {len(lines) - shown} more {what} (see report.md)"]


def _header(report: Report) -> list[str]:
    decided = verdict(report)
    counts = " · ".join(f"{n} {o}" for o, n in report.counts().items() if n) or "no checks"
    named = len([c for c in clause_outcomes(report.checks, report.findings) if c != NO_CLAUSE])
    env, run = report.environment, report.run
    sizes = ", ".join(str(s) for s in env.get("world_sizes", [])) or "none"
    facts = [
        f"strategy `{_clip(report.strategy.get('factory'), _TEXT)}`",
        f"shardcheck {report.suite_version}",
        f"torch {env.get('torch')}",
        f"backend {_clip(env.get('backend'), _TEXT)}",
        f"world sizes {sizes}",
    ]
    if run:
        seed = run.get("hypothesis_seed")
        facts += [
            f"profile `{run.get('hypothesis_profile')}`",
            f"seed {'none' if seed is None else seed}",
            f"started {run.get('started_at')}",
            f"{run.get('wall_time_s')} s",
            _restarts(len(run.get("heals", []))),
        ]
    lines = [
        f"## shardcheck conformance: {decided.word.upper()}",
        "",
        _clip(decided.sentence, _LINE) + ".",
        "",
        f"**Checks:** {counts} ({len(report.checks)} checks, {named} clauses)  ",
        "**Run:** " + _clip(" · ".join(facts), _LINE),
    ]
    if report.coverage:
        lines[-1] += "  "
        lines.append("**Coverage:** " + _clip(coverage_line(report.coverage), _LINE))
    return lines


def _findings(report: Report, shown: int | None) -> list[str]:
    if not report.findings:
        return []
    rows = []
    for f in report.findings:
        what = ("(late) " if f.late else "") + f.message
        first = f.checks[0] if f.checks else ""
        clauses = _clip(", ".join(f.clauses), _TEXT)
        cells = (f.id, f.kind, clauses, _code(what, _LINE), _code(first), str(len(f.checks)))
        rows.append("| " + " | ".join(cells) + " |")  # the headline whole, up to _LINE
    return [
        "",
        f"### Findings ({len(report.findings)}, worst kind first)",
        "",
        "| finding | kind | clause | what | first check | checks |",
        "|---|---|---|---|---|---|",
        *_rows(rows, shown, "findings"),
    ]


#: The "first" cell of a clause no check counts against: every check was refused or needs
#: another environment, or the clause does not apply ([Note: not applicable] in
#: harness.report.model); otherwise a late finding broke it.
_NO_CHECK_AGAINST = {
    "unsupported": "(every check declared unsupported)",
    "environment": "(every check needs another environment)",
    "not applicable": "(it applies to no family the strategy offers)",
}


def _clauses(report: Report, shown: int | None) -> list[str]:
    table = clause_outcomes(report.checks, report.findings)
    by_family = clause_family_outcomes(report.checks, report.findings)
    tally: dict[str, int] = {}
    for outcome, _ in table.values():
        tally[outcome] = tally.get(outcome, 0) + 1
    lines = [
        "",
        f"### Clauses ({len(table)}: " + ", ".join(f"{n} {o}" for o, n in tally.items()) + ")",
    ]
    rows = []
    for clause, (outcome, members) in table.items():
        if outcome == "passed":
            continue
        bad = against(clause, members)
        split = ", ".join(f"{fam}={o}" for fam, o in by_family.get(clause, {}).items())
        first = _code(bad[0].id) if bad else _NO_CHECK_AGAINST.get(outcome, "(a late finding)")
        family = f" {split} |" if by_family else ""
        rows.append(f"| {clause} | {outcome} |{family} {len(bad)} of {len(members)} | {first} |")
    if rows:
        family_head, family_rule = (" by family |", "---|") if by_family else ("", "")
        lines += [
            "",
            f"| clause | outcome |{family_head} checks against it | first |",
            f"|---|---|{family_rule}---|---|",
            *_rows(rows, shown, "clauses"),
        ]
    passed = [
        clause + environment_note(clause, members)
        for clause, (outcome, members) in table.items()
        if outcome == "passed"
    ]
    if passed:
        listed = passed if shown is None else passed[: max(shown, 1)]
        more = f" ... and {len(passed) - len(listed)} more" if len(listed) < len(passed) else ""
        lines += ["", f"Passed ({len(passed)}): {', '.join(listed)}{more}"]
    return lines


def _cost(report: Report, shown: int | None) -> list[str]:
    families = report.cost.get("families", {}) if report.cost else {}
    if not families:
        return []
    worlds = sorted({p["world_size"] for fam in families.values() for p in fam.get("series", [])})
    rows = []
    for name, family in families.items():
        at = {p["world_size"]: p["at_rest"].get("total", 0) for p in family.get("series", [])}
        projected = family.get("projection", {}).get("at", {})
        plain = family.get("plain")
        cells = [human_bytes(at[w]) if w in at else "-" for w in worlds]
        cells.append(human_bytes(footprint(plain)) if plain else "-")
        cells += [
            human_bytes(projected[str(w)]) if str(w) in projected else "-" for w in PROJECTED_WORLDS
        ]
        rows.append(f"| {_clip(name, _TEXT)} | " + " | ".join(cells) + " |")
    heads = [f"world {w}" for w in worlds] + ["plain model"]
    heads += [f"{w} (projected)" for w in PROJECTED_WORLDS]
    return [
        "",
        "### Cost: bytes per rank at rest, after the step",
        "",
        "Each family's main configuration, its largest rank; plain model: params + grads + "
        "optimizer in one process; (projected): `fixed + sharded / world` fitted to the measured "
        "world sizes, not measured. Every configuration, peaks and collectives: `report.md`.",
        "",
        "| family | " + " | ".join(heads) + " |",
        "|---|" + "---:|" * len(heads),
        *_rows(rows, shown, "families"),
    ]


def _footer() -> list[str]:
    return [
        "",
        "Full report beside this file: `report.md` (every failure with its reproducer), "
        "`report.html` (open in a browser), `report.json` (for tools; "
        "`python -m harness.report diff OLD.json NEW.json`).",
    ]


def _render(report: Report, shown: int | None) -> str:
    lines = [
        *_header(report),
        *_findings(report, shown),
        *_clauses(report, shown),
        *_cost(report, shown),
        *_footer(),
    ]
    return "\n".join(lines) + "\n"


def _largest(fits: Callable[[int], bool], high: int) -> int:
    """The largest ``n`` in ``0..high`` with ``fits(n)`` (0 when none does)."""
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _cut(text: str, limit: int) -> str:
    note = "\n... (the summary was cut here to stay within its size; see report.md)\n"
    room = limit - len(note.encode())
    head = text.encode()[:room].decode(errors="ignore")
    return head[: head.rfind("\n")] + note if "\n" in head else head + note


def render_summary(report: Report, limit: int = SUMMARY_LIMIT) -> str:
    """``summary.md`` for ``report``, at most ``limit`` bytes in UTF-8.

    Raises:
        ValueError: ``limit`` is too small to hold even a cut summary (under 1,000 bytes).
    """
    if limit < 1000:
        raise ValueError(f"summary limit={limit} bytes is too small; pass at least 1000.")
    text = _render(report, None)
    if len(text.encode()) <= limit:
        return text
    most = max(len(report.findings), len(report.checks), 1)
    shown = _largest(lambda n: len(_render(report, n).encode()) <= limit, most)
    text = _render(report, shown)
    return text if len(text.encode()) <= limit else _cut(text, limit)


def _restarts(count: int) -> str:
    """``1 restart of the ranks`` (see [Note: heals are counted] in harness.pool.rankpool)."""
    return f"{count} restart{'s' if count != 1 else ''} of the ranks"
