"""A finding's example: the failing example as Hypothesis printed it, or the check's call.

Hypothesis adds the example to the failure as a note, which pytest prints after the error with
its ``E`` prefix::

    E       Failing test case: test_x(
    E           n=7,
    E       )
    E       Draw 1: 7
    E       Draw 2 (plan): Plan(size=2,
    E        steps=3)

The header is ``Falsifying example:`` up to Hypothesis 6.16x, ``Failing test case:`` after,
and ``Falsifying explicit example:``/``Failing explicit example:`` for an ``@example``; a
state machine's example follows a bare header, one step a line. :func:`failing_example`
returns the first such block without the prefix; :func:`call_example` stands in for a check
that had no Hypothesis example (its id and its parameters).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["call_example", "failing_example", "finding_example", "item_parameters"]

_HEADER = re.compile(
    r"^(?P<prefix>E?[ \t]*)(?:Falsifying|Failing) (?:explicit )?(?:example|test case):(?P<rest>.*)$"
)
_DRAW = re.compile(r"^Draw \d+(?: \([^)]*\))?:")
#: lines of an example kept at most (a huge argument is not the report's business)
_MAX_LINES = 200
_MAX_VALUE = 120


def _unprefixed(line: str, prefix: str) -> str:
    if line.startswith(prefix):
        return line[len(prefix) :]
    if prefix.startswith("E") and line.rstrip() == "E":
        return ""
    return line


def failing_example(text: str) -> str:
    """The first failing example Hypothesis printed in a failure's ``text``, with any ``Draw``
    lines after it; ``""`` when there is none."""
    lines = text.splitlines()
    for start, line in enumerate(lines):
        header = _HEADER.match(line)
        if header is None:
            continue
        prefix = header.group("prefix")
        rest = header.group("rest").strip()
        block = [_unprefixed(line, prefix).strip()]
        following = (_unprefixed(x, prefix).rstrip() for x in lines[start + 1 :])
        if rest.endswith("("):  # a call over several lines, to its closing parenthesis
            for body in following:
                block.append(body)
                if body == ")":
                    break
        elif not rest:  # a state machine's steps, to the first blank line
            for body in following:
                if not body.strip():
                    break
                block.append(body)
        drawing = False
        for body in following:  # st.data()'s draws, each over its indented lines
            drawing = bool(_DRAW.match(body)) or (drawing and body[:1] in (" ", "\t"))
            if not drawing:
                break
            block.append(body)
        if len(block) > _MAX_LINES:
            block = [*block[:_MAX_LINES], f"... ({len(block) - _MAX_LINES} more lines)"]
        return "\n".join(block)
    return ""


def _short(value: str) -> str:
    return value if len(value) <= _MAX_VALUE else value[: _MAX_VALUE - 3] + "..."


def item_parameters(item: Any) -> dict[str, str]:
    """A pytest item's parameters (``callspec.params``), each value's ``repr``, clipped."""
    params = getattr(getattr(item, "callspec", None), "params", None) or {}
    return {str(name): _short(repr(value)) for name, value in params.items()}


def call_example(check_id: str, params: Mapping[str, str]) -> str:
    """The check and its parameters, for a failure without a Hypothesis example, e.g.
    ``test_api.test_build[fsdp-2] (family='fsdp', world_size=2)``."""
    if not params:
        return check_id
    args = ", ".join(f"{name}={_short(value)}" for name, value in params.items())
    return f"{check_id} ({args})"


def finding_example(text: str, check_id: str, params: Mapping[str, str]) -> str:
    """The example of a finding first met in ``check_id``: Hypothesis' failing example in its
    failure ``text``, else the check's call."""
    return failing_example(text) or call_example(check_id, params)
