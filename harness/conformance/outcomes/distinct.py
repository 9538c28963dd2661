"""Hypothesis' several distinct failures of one check, each told in the check's failure text.

With ``report_multiple_bugs`` (Hypothesis' default), a search that met failures of different
kinds raises them together (an exception group, "Hypothesis found N distinct failures"), and
pytest's one-line summary of it says only that. The check's failure text lists them instead:
each one's headline, the example that fails it, and the option that replays that example, the
one the finding is about (:func:`harness.conformance.findings.signatures.attribute`) first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from harness.conformance.findings.signatures import Attribution, distinct_failures
from harness.conformance.outcomes.replay import DECORATOR, as_option
from harness.verdicts.outcomes import RankFailure

__all__ = ["Distinct", "describe"]

#: the note Hypothesis puts on each failure: ``Failing test case: test(x=1)`` (6.1xx; older
#: releases wrote ``Falsifying example:``)
_MAX_EXAMPLE = 800  # characters of one failing example (a state machine's steps can be many)
_EXAMPLE = re.compile(r"^\s*(?:Failing test case|Falsifying (?:explicit )?example):\s*", re.S)


@dataclass(frozen=True)
class Distinct:
    """What a check's several distinct failures add to its failure text.

    Args:
        listing: the failure text's lines that list them, the first one's headline first.
        notes: the first one's notes as Hypothesis wrote them (its failing example and its
            ``@reproduce_failure(...)``), or ``""``: put before the rest of the failure text so
            that the finding's example and the reproduce line are that one's.
    """

    listing: str
    notes: str


def _notes(exc: BaseException) -> list[str]:
    return [str(note) for note in getattr(exc, "__notes__", [])]


def _example(exc: BaseException) -> str:
    for note in _notes(exc):
        if _EXAMPLE.match(note):
            example = _one_line(_EXAMPLE.sub("", note, count=1).strip())
            cut = len(example) - _MAX_EXAMPLE
            return f"{example[:_MAX_EXAMPLE]} ... ({cut} characters cut)" if cut > 0 else example
    return ""


def _one_line(example: str) -> str:
    """``test(\\n    x=1,\\n    y=2,\\n)`` as ``test(x=1, y=2)``; other examples (a state
    machine's steps) with their lines indented under the first."""
    lines = example.splitlines()
    if len(lines) > 2 and lines[0].endswith("(") and lines[-1].strip() == ")":
        arguments = " ".join(line.strip() for line in lines[1:-1]).rstrip(",")
        return f"{lines[0]}{arguments})"
    return "\n    ".join(line.strip() for line in lines)


def _headline(leaf: BaseException, attribution: Attribution) -> str:
    """One failure's line as pytest would summarise it alone (``ValueError: ...``); a rank's
    story (``rank 1 raised ...``) as it is."""
    message = attribution.message or "(no message)"
    if isinstance(leaf, RankFailure):
        return message
    name = type(leaf).__name__
    return message if message.startswith(name) else f"{name}: {message}"


def _decorator(exc: BaseException) -> str:
    found = next((DECORATOR.search(note) for note in _notes(exc) if DECORATOR.search(note)), None)
    return found.group(0) if found else ""


def describe(exc: BaseException, own: Sequence[str] = ()) -> Distinct | None:
    """The listing of ``exc``'s distinct failures, or None when it holds only one.

    Args:
        exc: the exception the check's test raised.
        own: the check's clauses (the failure that breaks one of them comes first).
    """
    failures = distinct_failures(exc, own)
    if len(failures) < 2:
        return None
    lines: list[str] = []
    for number, (leaf, attribution) in enumerate(failures, start=1):
        headline = _headline(leaf, attribution)
        if number == 1:
            lines.append(f"{headline} (1 of {len(failures)} distinct failures Hypothesis found)")
        else:
            lines.append(f"{number} of {len(failures)}: {headline}")
        example = _example(leaf)
        if example:
            lines.append(f"  failing example: {example}")
        replay = as_option(_decorator(leaf))
        if replay:
            lines.append(f"  replay it: {replay}")
    first = failures[0][0]
    notes = [n.strip() for n in _notes(first) if _EXAMPLE.match(n) or DECORATOR.search(n)]
    return Distinct("\n".join(lines), "\n".join(notes))
