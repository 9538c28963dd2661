"""The contract as Markdown (``CONTRACT.md``) and as the plain text of ``--list-clauses``."""

from __future__ import annotations

import textwrap

from harness.clauses import FAMILIES, PREAMBLE, SECTIONS
from harness.clauses.registry import Clause

__all__ = ["render_listing", "render_markdown"]

_HEADER = (
    "<!-- Written by `python -m harness.clauses --write CONTRACT.md` from harness/clauses/; "
    "edit the registry, not this file. -->"
)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (a bare ``|`` would end the cell)."""
    return text.replace("|", "\\|")


def families_cell(clause: Clause) -> str:
    """The families a clause applies to, as CONTRACT.md's column says them."""
    if clause.families == FAMILIES:
        return "every family"
    return ", ".join(clause.families)


def render_markdown() -> str:
    """The whole contract: title, preamble, one table per section (each clause with the
    families it applies to: a clause none of whose families the strategy offers reads ``not
    applicable``)."""
    lines = [_HEADER, "", "# The shardcheck contract", "", PREAMBLE, ""]
    for section in SECTIONS:
        lines += [f"## {section.number}. {section.title}", ""]
        if section.intro:
            lines += [section.intro, ""]
        lines += ["| id | families | clause |", "|---|---|---|"]
        lines += [f"| {c.id} | {families_cell(c)} | {_cell(c.text)} |" for c in section.clauses]
        lines.append("")
    return "\n".join(lines)


def render_listing(ids: list[str] | None = None, width: int = 100) -> str:
    """Plain text for the terminal: each clause id with its text wrapped under it.

    Args:
        ids: only these clauses (all when None), kept in contract order.
        width: the line width to wrap at.
    """
    wanted = None if ids is None else set(ids)
    lines: list[str] = []
    for section in SECTIONS:
        chosen = [c for c in section.clauses if wanted is None or c.id in wanted]
        if not chosen:
            continue
        lines += [f"{section.number}. {section.title}", ""]
        for clause in chosen:
            lines.append(clause.id)
            lines += textwrap.wrap(
                clause.text, width, initial_indent="    ", subsequent_indent="    "
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
