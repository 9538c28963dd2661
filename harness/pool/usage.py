"""What each rank of a pool held over the run: threads, memory and open files.

Every job's reply carries the rank's :class:`~harness.wire.protocol.Usage` after the job
(see [Note: bounded ranks] in :mod:`harness.rank.usage`). :class:`PoolUsage` keeps, per
rank, the first and last figures of the run and the peaks, across the pool's generations
(a rank replaced by a heal goes on under the same rank), and the recycles: the ranks that
asked to be replaced because what they held stayed over their bound. The report keeps
:meth:`PoolUsage.as_dict` per world size; the terminal prints :func:`usage_line`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.verdicts.outcomes import Outcome
from harness.wire.protocol import Usage

__all__ = ["PoolUsage", "RankUsage", "leak_warning", "usage_line"]


@dataclass
class RankUsage:
    """One rank's figures over the run.

    Args:
        first: after its first job.
        last: after its last job.
        peak: the largest threads, memory and open files seen (each its own maximum).
        jobs: jobs that reported a usage.
    """

    first: Usage
    last: Usage
    peak: Usage
    jobs: int = 1

    def note(self, usage: Usage) -> None:
        """Add the figures after one more job."""
        self.last = usage
        self.jobs += 1
        self.peak = Usage(
            max(self.peak.threads, usage.threads),
            max(self.peak.rss_mib, usage.rss_mib),
            max(self.peak.open_files, usage.open_files),
        )

    def as_dict(self) -> dict[str, Any]:
        """The report's form: ``threads``, ``rss_mib`` and ``open_files``, each with its
        ``first``, ``last`` and ``peak``; and ``jobs``."""
        figures: dict[str, Any] = {
            name: {
                "first": getattr(self.first, name),
                "last": getattr(self.last, name),
                "peak": getattr(self.peak, name),
            }
            for name in ("threads", "rss_mib", "open_files")
        }
        figures["jobs"] = self.jobs
        return figures


@dataclass
class PoolUsage:
    """The figures of every rank of one pool, and its recycles (``(ranks, what)``: the
    ranks that asked, and what they held too much of)."""

    ranks: dict[int, RankUsage] = field(default_factory=dict)
    recycles: list[tuple[list[int], str]] = field(default_factory=list)

    def note(self, outcomes: Sequence[Outcome]) -> str:
        """Add one job's figures; return what the ranks that ask to be recycled hold too
        much of (``""`` when none asks)."""
        asking: dict[int, str] = {}
        for outcome in outcomes:
            usage = outcome.usage
            if usage is None:
                continue
            kept = self.ranks.get(outcome.rank)
            if kept is None:
                self.ranks[outcome.rank] = RankUsage(usage, usage, usage)
            else:
                kept.note(usage)
            if usage.recycle:
                asking[outcome.rank] = usage.recycle
        if not asking:
            return ""
        what = ", ".join(dict.fromkeys(asking.values()))
        self.recycles.append((sorted(asking), what))
        return what

    def as_dict(self) -> dict[str, Any]:
        """The report's form: ``ranks`` (by rank, see :meth:`RankUsage.as_dict`) and
        ``recycles`` (``{"ranks", "over"}``, one per restart)."""
        return {
            "ranks": {str(rank): kept.as_dict() for rank, kept in sorted(self.ranks.items())},
            "recycles": [{"ranks": ranks, "over": what} for ranks, what in self.recycles],
        }


def usage_line(pools: Mapping[int, PoolUsage]) -> str:
    """One line for the end of the run: per world size, the threads, memory and open files
    of its busiest rank first and last (peak), and the recycles (``""`` without figures)."""
    parts = []
    for size, pool in sorted(pools.items()):
        if not pool.ranks:
            continue
        first = max(r.first.threads for r in pool.ranks.values())
        last = max(r.last.threads for r in pool.ranks.values())
        peak = max(r.peak.threads for r in pool.ranks.values())
        rss = max(r.peak.rss_mib for r in pool.ranks.values())
        files = max(r.peak.open_files for r in pool.ranks.values())
        part = (
            f"world size {size}: threads {first} -> {last} (peak {peak}), "
            f"memory peak {rss:.0f} MiB, open files peak {files}"
        )
        if pool.recycles:
            part += f", recycled {len(pool.recycles)} time{'s' if len(pool.recycles) > 1 else ''}"
        parts.append(part)
    return ("rank resources per rank, first -> last job: " + "; ".join(parts)) if parts else ""


def leak_warning(pools: Mapping[int, PoolUsage], strategy: str) -> str:
    """A warning naming ``strategy`` when its jobs left more than the ranks' bound alive
    after a full collection (the ranks were recycled for it), else ``""``."""
    recycles = [(size, what) for size, pool in pools.items() for _, what in pool.recycles]
    if not recycles:
        return ""
    what = ", ".join(dict.fromkeys(w for _, w in recycles))
    sizes = ", ".join(str(s) for s in sorted({size for size, _ in recycles}))
    return (
        f"the jobs of {strategy} left {what} alive after they ended (process groups, meshes, "
        f"threads or files the strategy keeps); the ranks held more than their bound "
        f"{len(recycles)} time{'s' if len(recycles) != 1 else ''} (world size {sizes}) and "
        "were replaced each time. Release what a strategy creates in its teardown(), or see "
        "docs/rank-resources.md."
    )
