"""What the terminal says while a run goes on: each new finding the moment it is found, and
how far a long run has come.

pytest prints a dot per test; a conformance run can take many minutes, and a failing
check's verdict (its traceback, shrunk example and findings table) comes only at the end.
:class:`Progress` writes, on lines of their own between the dots:

- ``shardcheck: F1 new finding, CKPT-RT-1: <message> (in <check>)`` and the command that
  reruns that check, once per finding, when its first check failed; a failure of a check the
  expected-failures file lists is no news: ``shardcheck: F1 expected finding, ...`` on one
  line (and ``new finding`` after all, should a check it does not list fail with it too);
- ``shardcheck: 45 of 267 checks, 2 min 10 s, about 8 min left`` once a minute after the
  first minute (the estimate assumes the remaining checks take the average so far).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["EVERY_S", "Progress", "duration", "unprefixed"]

#: seconds between two progress lines (the first comes after as long)
EVERY_S = 60.0


def unprefixed(message: str, clauses: list[str]) -> str:
    """The first line of ``message`` without the clause ids it starts with (the line that
    names them already says them: no "CL-1: CL-1: ...")."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    while any(first.startswith(f"{clause}: ") for clause in clauses):
        first = first.split(": ", 1)[1]
    return first


def duration(seconds: float) -> str:
    """``45 s``, ``2 min 10 s`` or ``1 h 5 min``."""
    total = round(seconds)
    if total < 60:
        return f"{total} s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


class Progress:
    """Writes the run's progress lines.

    Args:
        write: writes one line on a line of its own (the terminal reporter's), or None to
            write nothing (no terminal: ``-p no:terminal``).
        clock: seconds, monotonic (tests pass their own).
        every_s: seconds between two progress lines.
    """

    def __init__(
        self,
        write: Callable[[str], None] | None,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = EVERY_S,
    ) -> None:
        self.write = write
        self.clock = clock
        self.every_s = every_s
        self.started = clock()
        self.next_at = self.started + every_s
        self.announced: set[str] = set()  # said as new
        self.expected: set[str] = set()  # said as expected (met in listed checks only)

    def finding(
        self, finding_id: str, clauses: list[str], message: str, where: str, listed: bool = False
    ) -> bool:
        """A failure was filed under ``finding_id``: say so if it is new (once per id), or,
        for a check the expected-failures file lists (``listed``), that it was expected.
        Returns whether it said a new finding (then its reproducer follows)."""
        if self.write is None or finding_id in self.announced:
            return False
        if listed and finding_id in self.expected:
            return False
        # the whole headline: what is wrong comes first, and a cut would drop the value
        first = unprefixed(message, clauses) or "(no message)"
        if listed:
            self.expected.add(finding_id)
            self.write(
                f"shardcheck: {finding_id} expected finding, {', '.join(clauses)}: {first} "
                f"(in {where}, listed in --expected-failures)"
            )
            return False
        self.announced.add(finding_id)
        self.write(f"shardcheck: {finding_id} new finding, {', '.join(clauses)}: {first}")
        self.write(f"  in {where}")
        return True

    def reproduce(self, command: str) -> None:
        """The command that reruns the check a new finding came from."""
        if self.write is not None and command:
            self.write(f"  reproduce: {command}")

    def checks_done(self, done: int, total: int) -> None:
        """A check ended: write a progress line when one is due."""
        now = self.clock()
        if self.write is None or now < self.next_at or total <= 0:
            return
        self.next_at = now + self.every_s
        elapsed = now - self.started
        line = f"shardcheck: {done} of {total} checks, {duration(elapsed)}"
        if 0 < done < total:
            line += f", about {duration(elapsed / done * (total - done))} left"
        self.write(line)


def terminal_writer(config: Any) -> Callable[[str], None] | None:
    """A function writing one line on a line of its own to pytest's terminal, or None."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return None

    def write(line: str) -> None:
        # after pytest's progress letters ("..F"), start a line of our own
        writer = getattr(reporter, "_tw", None)
        if getattr(writer, "width_of_current_line", 0):
            reporter.write("\n")
        reporter.write_line(line)

    return write
