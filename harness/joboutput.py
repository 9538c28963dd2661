"""Where each job's per-rank output goes: the plugin's sink, or this process's own streams.

Every job's outcomes are published once: their warnings are counted for the session's
summary (:mod:`harness.rankwarnings`), late violations are noted for their clause
(:mod:`harness.attribution`), and stdout/stderr go to the sink the plugin set for the test
being run (its report sections) or, with no sink, to this process, each line prefixed with
its rank.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from harness.attribution import note_late
from harness.outcomes import Outcome
from harness.rankwarnings import COLLECTED

__all__ = ["OutputSink", "publish", "set_output_sink"]

OutputSink = Callable[[Sequence[Outcome]], None]

_sink: OutputSink | None = None


def set_output_sink(sink: OutputSink | None) -> OutputSink | None:
    """Route each job's per-rank output to ``sink`` (the plugin's report sections).

    Returns the previous sink. With no sink, output is written to this process's
    stdout/stderr, each line prefixed with its rank.
    """
    global _sink
    previous, _sink = _sink, sink
    return previous


def publish(outcomes: Sequence[Outcome]) -> None:
    """Publish one job's outcomes (see the module docstring)."""
    COLLECTED.add(outcomes)
    for o in outcomes:
        if o.late:
            note_late(o.rank, o.late)
    if not any(o.stdout or o.stderr or o.warnings for o in outcomes):
        return
    if _sink is not None:
        _sink(outcomes)  # warnings: counted for the session's summary instead
        return
    for o in outcomes:
        for text, stream in ((o.stdout, sys.stdout), (o.stderr + o.warnings, sys.stderr)):
            for line in text.splitlines():
                print(f"[rank {o.rank}] {line}", file=stream)
