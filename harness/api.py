"""``run_on_ranks`` and the functions scripts and tests call on the session in force.

Each one acts on :func:`harness.run.session.current`: the pytest plugin's session inside a test
run (configured from the command line), or a session with the default settings
(:class:`harness.config.HarnessConfig`) for scripts such as the benchmark. Pools start on
first use and live until :func:`shutdown` (session end, or interpreter exit).
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import Any

from harness.config import BACKENDS, HarnessConfig, default_nproc, resolve_backend
from harness.config import gpu_count as _gpu_count  # noqa: F401  (the tests ask api)
from harness.pool.rankpool import RankPool
from harness.run import jobs
from harness.run.session import OutputSink, current, shutdown_all

__all__ = [
    "BACKENDS",
    "HarnessConfig",
    "configure",
    "current_config",
    "default_nproc",
    "jobs_dispatched",
    "lost_reason",
    "max_world_size",
    "pool_for",
    "resolve_backend",
    "run_on_ranks",
    "set_output_sink",
    "shutdown",
    "unavailable_reason",
    "warm_up",
    "world_sizes",
    "world_sizes_used",
]


def configure(**changes: Any) -> HarnessConfig:
    """Change the session's settings (see :class:`HarnessConfig`); running pools are stopped.

    Raises:
        ValueError: a value is out of range (the message names it and the fix).
    """
    return current().configure(**changes)


def current_config() -> HarnessConfig:
    """The session settings in force."""
    return current().config


def max_world_size() -> int:
    """The largest world size this session may run (``--nproc``, or torchrun's size)."""
    return current().config.max_world_size()


def world_sizes() -> list[int]:
    """Every world size this session can run: ``1..--nproc``, or in attach mode ``1..N`` for
    torchrun's ``N`` ranks."""
    return current().config.world_sizes()


def unavailable_reason(world_size: int) -> str | None:
    """Why ``world_size`` cannot run in this session (``environment: ...``), or ``None``."""
    return current().unavailable_reason(world_size)


def lost_reason() -> str | None:
    """Why the run cannot go on (in attach mode, a rank is gone), else ``None``."""
    return current().lost_reason()


def world_sizes_used() -> list[int]:
    """The world sizes the session made pools for (read them before the pools stop)."""
    return current().world_sizes_used()


def pool_for(world_size: int) -> RankPool:
    """The session's pool for ``world_size`` (created, not started, on first use): local
    ranks over pipes, or in attach mode torchrun's ranks over its store."""
    return current().pool_for(world_size)


def run_on_ranks(
    fn: Callable[..., Any], *args: Any, world_size: int, timeout: float | None = None
) -> list[Any]:
    """Run ``fn(ctx, *args)`` on every rank of the pool of that size; results, index = rank.

    Args:
        fn: a module-level function of an importable module or of a collected test file.
        *args: picklable arguments, the same for every rank.
        world_size: number of ranks (at most ``--nproc``).
        timeout: the job deadline in seconds; ``None`` means one learned from this check's
            passing jobs (:mod:`harness.run.deadlines`), at most ``--rank-timeout``.

    Raises:
        RankFailure: a rank raised, crashed or hung; the message tells every rank's story.
            A job that hung or broke a collective is replayed once with collective
            checking (as are the check's later jobs): ranks in mismatched collectives raise
            :class:`~harness.verdicts.failures.CollectiveDesync`, ranks left waiting in one
            :class:`~harness.verdicts.failures.CollectiveHang`.
        Unsupported: every rank raised ``Unsupported`` (the strategy refused the config).
        TypeError, ValueError: bad arguments (named in the message).

    A world size larger than the session's (``--nproc``, or torchrun's world size in attach
    mode) is refused (:mod:`harness.refusals`):
    the example is rejected inside Hypothesis, the test skipped as ``environment`` outside.
    """
    __tracebackhide__ = True
    return jobs.run_on_ranks(current(), fn, args, world_size, timeout)


def jobs_dispatched() -> int:
    """How many rank jobs the session has dispatched so far (every world size)."""
    return current().last_job_id


def set_output_sink(sink: OutputSink | None) -> OutputSink | None:
    """Route each job's per-rank output to ``sink`` (the plugin's report sections).

    Returns the previous sink. With no sink, output is written to this process's
    stdout/stderr, each line prefixed with its rank.
    """
    session = current()
    previous, session.output_sink = session.output_sink, sink
    return previous


def warm_up() -> None:
    """Let the transport prepare the first pool now (the local one starts its forkserver,
    which imports torch in the background while pytest collects)."""
    current().warm_up()


def shutdown(final: bool = False) -> None:
    """Stop every pool of the session (no rank process is left) and remove its temp files.

    Args:
        final: also stop what the transport keeps for the whole session (the local
            transport's forkserver): at the session's end.
    """
    current().shutdown(final)


atexit.register(shutdown_all)
