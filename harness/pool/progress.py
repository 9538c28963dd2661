"""Slow is not hung: whether ranks still inside a job at its cutoff are working.

[Note: slow is not hung] A job's deadline is learned from the check's passing jobs on the
machine as it was then (:mod:`harness.run.deadlines`); on a busy machine (a shared CI
runner, other suites beside this one) the same job can take many times longer without
anything being wrong. On a 2-core machine whose load average reached 350, four ranks all
inside the same ``all_gather_object`` were called hung at a 30 s deadline, in checks that
pass on an idle machine. So before the pool calls ranks hung at a deadline, or at the grace
after another rank finished, it compares two samples of them :data:`WINDOW` seconds apart
(:class:`Sample`, taken by :meth:`RankPool._gather`):

- their CPU time (the process's, every thread's: a collective in progress moves it, a rank
  blocked in one does not);
- their Python stacks (a rank whose stack changed has moved on);
- their runnable threads (a thread waiting for a core on an overloaded machine is working,
  not waiting on a peer);
- the machine: load average per core (less the pool's own ranks), and CPU steal over the
  window.

A rank's signs count only while it has spent less than half its deadline on CPU in the job
(:data:`CPU_SHARE`): a rank slowed by a busy machine gets a small share of a core, while a
rank that had the cores it wanted and still runs past its deadline computes without end (an
endless loop is named at its deadline on an idle machine, as before).

If any of them says the ranks work, or (at the deadline, while no rank has finished and
every rank is inside a collective) the machine is overloaded, so that a rank that wants a
core may not get one within the window and its peers wait for it, the cutoff moves on by
the job's own deadline (at least :data:`EXTENSION_FLOOR` s), never past ``--rank-timeout``.
Ranks that wait on each other sleep in the collective: no CPU, the same stack, no runnable
thread; on a machine that is not overloaded they are named at the cutoff as before. A rank
alone in a collective after the others finished is such a rank, so it is still named
seconds after the grace.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from harness.pool.stall import cpu_seconds, runnable_threads
from harness.verdicts.collectives import waiting_collective
from harness.verdicts.outcomes import tidy_stacks

__all__ = [
    "EXTENSION_FLOOR",
    "OVERLOAD",
    "WINDOW",
    "MachineLoad",
    "Sample",
    "machine_load",
    "moved_line",
    "progress",
    "take_sample",
]

#: seconds between the two samples compared at a cutoff
WINDOW = 2.0
#: CPU seconds a rank must use over the window to count as working
PROGRESS_CPU = 0.05
#: load average per usable core, less the pool's own ranks, above which the machine is
#: overloaded
OVERLOAD = 2.0
#: steal (share of CPU time the hypervisor gave to others) above which it is overloaded
STEAL = 0.10
#: the smallest step by which a cutoff moves on
EXTENSION_FLOOR = 10.0
#: the share of its deadline a rank may have spent on CPU in the job and still count as
#: slowed by the machine (more, and it computes without end: see [Note: slow is not hung])
CPU_SHARE = 0.5


@dataclass(frozen=True)
class MachineLoad:
    """The machine's load: the 1-minute load average, the usable cores, and the CPU ticks
    (``total``, ``steal``) counted by the kernel so far."""

    average: float
    cores: int
    total: int
    steal: int


def machine_load() -> MachineLoad | None:
    """The load now (``None`` without ``/proc``)."""
    try:
        with open("/proc/loadavg") as f:
            one_minute = float(f.read().split()[0])
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    steal = ticks[7] if len(ticks) > 7 else 0
    return MachineLoad(one_minute, max(1, cores or 1), sum(ticks), steal)


@dataclass(frozen=True)
class Sample:
    """The ranks still inside a job, at one moment (see [Note: slow is not hung]).

    Args:
        at: when (``time.monotonic()``).
        cpu: CPU seconds by rank (``None`` where unreadable).
        stacks: tidied Python stacks by rank (``""`` where none arrived).
        runnable: runnable threads by rank (``None`` where unreadable).
        load: the machine's load.
    """

    at: float
    cpu: Mapping[int, float | None]
    stacks: Mapping[int, str]
    runnable: Mapping[int, int | None]
    load: MachineLoad | None


def take_sample(
    at: float,
    ranks: Sequence[int],
    pids: Sequence[int],
    dump: Callable[[Sequence[int]], Mapping[int, str]],
) -> Sample:
    """Sample ``ranks`` (``pids`` by rank; ``dump`` returns their stacks by rank).

    CPU time and runnable threads are read before the stacks are asked for: the rank's
    thread that writes its stacks is woken to do so, runs, and uses CPU."""
    known = [r for r in ranks if r < len(pids)]
    cpu = {r: cpu_seconds(pids[r]) for r in known}
    runnable = {r: runnable_threads(pids[r]) for r in known}
    load = machine_load()
    stacks = dump(ranks)
    return Sample(at, cpu, {r: tidy_stacks(stacks.get(r, "")) for r in ranks}, runnable, load)


def progress(
    before: Sample,
    after: Sample,
    own_ranks: int | None = None,
    spent: Mapping[int, float] | None = None,
    deadline: float = float("inf"),
) -> str:
    """Why the ranks of ``after`` count as working or the machine as too busy to tell, in
    words; ``""`` when they wait (see [Note: slow is not hung]).

    Args:
        own_ranks: the pool's world size, when the machine's load counts: its load average
            less that many (the pool's own ranks may all be running) is compared with
            :data:`OVERLOAD`, when every rank is inside a collective. ``None``: only the
            ranks' own signs count (after another rank finished, a rank that neither runs nor
            waits for a core waits on a peer).
        spent: CPU seconds each rank has used since the job started.
        deadline: the job's deadline in seconds: a rank that has spent more than
            :data:`CPU_SHARE` of it on CPU got the cores it wanted and is not slowed by the
            machine (an endless loop on an idle machine), so its signs do not count.
    """
    budget = CPU_SHARE * deadline
    starved = [r for r in after.cpu if spent is None or spent.get(r, 0.0) <= budget]
    for rank in starved:
        cpu = after.cpu[rank]
        cpu_was = before.cpu.get(rank)
        if cpu is not None and cpu_was is not None and cpu - cpu_was >= PROGRESS_CPU:
            used, window = cpu - cpu_was, after.at - before.at
            return f"rank {rank} used {used:.2f} s of CPU in {window:.1f} s"
    for rank in starved:
        stack, stack_was = after.stacks.get(rank, ""), before.stacks.get(rank, "")
        if stack and stack_was and stack != stack_was:
            return f"rank {rank}'s stack moved"
    for rank in starved:
        runnable = after.runnable.get(rank)
        if runnable and (before.runnable.get(rank) or 0) > 0:
            return f"rank {rank} has {runnable} runnable thread{'s' if runnable > 1 else ''}"
    load, was_load = after.load, before.load
    if own_ranks is None or load is None:
        return ""
    if not all(waiting_collective(stack) for stack in after.stacks.values()):
        return ""  # a rank outside a collective that neither runs nor waits for a core: idle
    others = (load.average - own_ranks) / load.cores
    if others >= OVERLOAD:
        return (
            f"the machine is overloaded (load average {load.average:.1f} on {load.cores} "
            f"core{'s' if load.cores > 1 else ''})"
        )
    if was_load is not None and load.total > was_load.total:
        steal = (load.steal - was_load.steal) / (load.total - was_load.total)
        if steal >= STEAL:
            return f"the machine is overloaded ({steal:.0%} of CPU time stolen)"
    return ""


def moved_line(moved: Mapping[int, Sequence[str]]) -> str:
    """One line for the end of the run: how often job cutoffs moved on because the ranks
    still worked, per world size, with the first reason (``""`` when none did)."""
    counts = {size: len(why) for size, why in sorted(moved.items()) if why}
    if not counts:
        return ""
    first = next(why[0] for _, why in sorted(moved.items()) if why)
    sizes = ", ".join(f"world size {size}: {n}" for size, n in counts.items())
    total = sum(counts.values())
    return (
        f"job cutoffs moved on {total} time{'s' if total != 1 else ''} while ranks still "
        f"worked ({sizes}; the first because {first})"
    )
