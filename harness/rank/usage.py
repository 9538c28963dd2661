"""What a rank process holds between jobs, and when it asks to be replaced.

[Note: bounded ranks] A rank lives for the whole run, thousands of jobs. Every job that
makes a process group (a device mesh, a hybrid-sharding group, a group of its own) leaves,
once the harness destroyed the group, a group object that keeps a gloo group's worker and
TCP-loop threads, sockets and buffers until nothing references it. The harness frees what
torch keeps itself (``torch_compat.clear_sharding_cache``, [Note: DTensor caches keep groups
alive]; the full collection of [Note: freeing the destroyed groups] in
:mod:`harness.rank.isolation`), but a strategy can keep more: a module-level cache of
meshes, a thread pool for asynchronous saves, files it never closes.

So after every job the rank reads what it holds (:func:`sample`, three reads of
``/proc/self``, about 0.1 ms) and compares it with what it held after joining its process
group (:class:`UsageGuard`). Over the bound (:data:`THREAD_ALLOWANCE` threads,
:data:`FILE_ALLOWANCE` open files or :data:`RSS_ALLOWANCE_MIB` of memory above the start) it
runs a full collection at once; still over it, its reply asks to be recycled, and the pool
replaces the ranks before the next job (a heal whose cause names what was over). Whatever
the strategy does, a rank then holds at most the bound plus what one job leaves.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable

from harness.wire.protocol import Usage

__all__ = ["FILE_ALLOWANCE", "RSS_ALLOWANCE_MIB", "THREAD_ALLOWANCE", "UsageGuard", "sample"]

#: threads a rank may hold above its count after joining, after a job (see [Note: bounded ranks])
THREAD_ALLOWANCE = 48
#: open file descriptors above the count after joining
FILE_ALLOWANCE = 256
#: resident memory above the size after joining, MiB
RSS_ALLOWANCE_MIB = 1024.0

_PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 0.0


def sample() -> Usage | None:
    """This process's threads, resident memory and open files (``None`` without ``/proc``)."""
    try:
        threads = len(os.listdir("/proc/self/task"))
        open_files = len(os.listdir("/proc/self/fd")) - 1  # less the one listdir opened
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    rss = round(resident_pages * _PAGE_MIB, 1)
    return Usage(threads, rss, open_files, time.process_time())


class UsageGuard:
    """Compares a rank's usage after each job with its usage after joining.

    Args:
        collect: runs a full garbage collection (and whatever the rank frees with it).
    """

    def __init__(self, collect: Callable[[], object] = gc.collect) -> None:
        self.collect = collect
        self.start = sample()

    def over(self, usage: Usage) -> str:
        """What in ``usage`` is over the bound (``threads``, ``open files``, ``memory``,
        joined by commas; ``""`` if nothing is)."""
        if self.start is None:
            return ""
        start, parts = self.start, []
        if usage.threads > start.threads + THREAD_ALLOWANCE:
            parts.append("threads")
        if usage.open_files > start.open_files + FILE_ALLOWANCE:
            parts.append("open files")
        if usage.rss_mib > start.rss_mib + RSS_ALLOWANCE_MIB:
            parts.append("memory")
        return ", ".join(parts)

    def after_job(self) -> Usage | None:
        """The usage now; over the bound, collected first, and still over it, marked to be
        recycled with what is over."""
        usage = sample()
        if usage is None or not self.over(usage):
            return usage
        self.collect()
        usage = sample()
        if usage is None:
            return None
        reason = self.over(usage)
        if not reason:
            return usage
        return Usage(usage.threads, usage.rss_mib, usage.open_files, usage.cpu_s, reason)
