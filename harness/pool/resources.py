"""Refuse a world size the machine cannot hold, at start-up, with the numbers.

A local session starts up to ``--nproc`` CPU ranks per pool, and keeps one pool per world
size it used. Far more ranks than cores only time out (each job waits for every rank), and
too many ranks for the memory swap or get killed, so :func:`check_world_size` refuses, before
any rank starts:

- on CPU (gloo), more than :data:`RANKS_PER_CORE` ranks per usable core. Four per core keeps
  the default ``--nproc 4`` running on any machine with one core or more; the suites' ranks
  spend most of a job waiting on each other, so a few ranks per core only slow them down.
  Ranks on GPUs (NCCL) are not counted against the cores: there the limit is one GPU per
  rank, which :func:`harness.api.resolve_backend` already enforces;
- an estimated memory need above the memory available now: :data:`RANK_MEMORY_MB` per rank
  for ``nproc`` ranks plus as many again for the pools of smaller world sizes
  (:data:`POOLED_RANKS`).

``--allow-oversubscribe`` skips both checks. Attach mode is not checked: torchrun started
its ranks before the controller runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "POOLED_RANKS",
    "RANKS_PER_CORE",
    "RANK_MEMORY_MB",
    "Machine",
    "OversubscribedError",
    "check_world_size",
    "estimated_memory_mb",
    "this_machine",
]

#: CPU ranks allowed per usable core.
RANKS_PER_CORE = 4
#: Memory one rank may take over a suites run (its share of torch's libraries, the FSDP and
#: DTensor modules, the jobs' tensors): 4 ranks with torch 2.14.1 held up to 9 ranks and their
#: forkserver at 1.8 GiB in all, about 180 MiB each (docs/options.md).
RANK_MEMORY_MB = 250
#: Ranks alive at once per ``--nproc``: the largest pool plus the pools of smaller sizes.
POOLED_RANKS = 2


class OversubscribedError(ValueError):
    """``--nproc`` asks for more ranks than this machine can hold (a usage error)."""


@dataclass(frozen=True)
class Machine:
    """What this machine offers the ranks.

    Args:
        cores: CPUs this process may run on.
        available_mb: memory available now in MiB (the cgroup's limit if lower), or None if
            unknown (the memory check is skipped then).
    """

    cores: int
    available_mb: int | None


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _meminfo_available_mb(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_available_mb(cgroup: Path) -> int | None:
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        used = int((cgroup / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    if limit == "max":
        return None
    try:
        return max(int(limit) - used, 0) // (1024 * 1024)
    except ValueError:
        return None


def this_machine(
    meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")
) -> Machine:
    """The usable cores and the memory available now (the smaller of the system's
    ``MemAvailable`` and what the cgroup v2 limit leaves)."""
    known = [m for m in (_meminfo_available_mb(meminfo), _cgroup_available_mb(cgroup)) if m]
    return Machine(cores=_usable_cores(), available_mb=min(known) if known else None)


def estimated_memory_mb(nproc: int) -> int:
    """The memory a session of ``--nproc nproc`` may reach, in MiB."""
    return nproc * POOLED_RANKS * RANK_MEMORY_MB


def _gb(mb: float) -> str:
    return f"{mb / 1024:.1f} GiB"


def check_world_size(nproc: int, backend: str, machine: Machine | None = None) -> None:
    """Refuse ``--nproc`` when this machine cannot hold it.

    Args:
        nproc: the largest world size of the session.
        backend: the resolved backend of the ranks (``gloo`` or ``nccl``); NCCL ranks each
            have a GPU and are not counted against the cores.
        machine: the machine to check against (default: :func:`this_machine`).

    Raises:
        OversubscribedError: with the numbers, the largest ``--nproc`` that fits and the
            override.
    """
    machine = machine or this_machine()
    problems: list[str] = []
    fits = nproc
    if backend != "nccl":
        most = machine.cores * RANKS_PER_CORE
        if nproc > most:
            problems.append(
                f"{nproc} CPU ranks on {machine.cores} core(s) is more than "
                f"{RANKS_PER_CORE} ranks per core ({most})"
            )
            fits = min(fits, most)
    need = estimated_memory_mb(nproc)
    if machine.available_mb is not None and need > machine.available_mb:
        problems.append(
            f"the ranks may need about {_gb(need)} of memory ({nproc} ranks plus up to "
            f"{nproc * (POOLED_RANKS - 1)} in the pools of smaller sizes, ~{RANK_MEMORY_MB} MiB "
            f"each), but {_gb(machine.available_mb)} is available"
        )
        fits = min(fits, machine.available_mb // (POOLED_RANKS * RANK_MEMORY_MB))
    if not problems:
        return
    advice = f"use --nproc {fits} or less" if fits >= 1 else "free some memory"
    raise OversubscribedError(
        f"--nproc={nproc} is more than this machine can hold: {'; and '.join(problems)}. "
        f"{advice[0].upper()}{advice[1:]}, or pass --allow-oversubscribe to start them anyway."
    )
