"""``run_on_ranks`` and the session state behind it: the settings in force, one pool per size.

The pytest plugin calls :func:`configure` once from the command-line options; scripts and
the benchmark use the defaults (:class:`harness.config.HarnessConfig`). Pools start on first
use and live until :func:`shutdown` (session end, or interpreter exit).
"""

from __future__ import annotations

import atexit
import itertools
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from harness.config import BACKENDS, HarnessConfig, default_nproc, resolve_backend
from harness.config import gpu_count as _gpu_count  # noqa: F401  (the tests ask api)
from harness.contract import Unsupported
from harness.deadlines import Deadlines, current_check
from harness.fnref import fn_ref_of
from harness.jobguard import before_job
from harness.joboutput import publish, set_output_sink
from harness.outcomes import Outcome
from harness.pool import RankPool
from harness.protocol import FnRef, Job
from harness.runner import pg_timeout_for
from harness.shrinking import shrink_once
from harness.transport import PoolSettings, Transport
from harness.transports import pipes
from harness.transports.pipes import PipeTransport, start_forkserver
from harness.verdicts import CollectiveDesync, CollectiveHang, failure_for

__all__ = [
    "BACKENDS",
    "HarnessConfig",
    "configure",
    "current_config",
    "default_nproc",
    "lost_reason",
    "max_world_size",
    "pool_for",
    "resolve_backend",
    "run_on_ranks",
    "set_output_sink",
    "shutdown",
    "take_unavailable_reason",
    "unavailable_reason",
    "warm_up",
    "world_sizes",
]


_config = HarnessConfig()
_pools: dict[int, RankPool] = {}
_root: str | None = None
_job_ids = itertools.count(1)
_last_job_id = 0
_unavailable: str | None = None  # why the last job was refused for its world size
_deadlines = Deadlines(ceiling=_config.rank_timeout)
_checked_check: str | None = None  # the check whose jobs run with collective checking


def configure(**changes: Any) -> HarnessConfig:
    """Change session settings (see :class:`HarnessConfig`); running pools are stopped.

    Raises:
        ValueError: a value is out of range (the message names it and the fix).
    """
    global _config
    new = replace(_config, **changes)
    new.check()
    shutdown()
    _config = new
    _reset_learning()
    return new


def _reset_learning() -> None:
    global _deadlines, _checked_check
    _deadlines = Deadlines(ceiling=_config.rank_timeout)
    _checked_check = None


def current_config() -> HarnessConfig:
    """The session settings in force."""
    return _config


def max_world_size() -> int:
    """The largest world size this session may run (``--nproc``, or torchrun's size)."""
    return _config.max_world_size()


def world_sizes() -> list[int]:
    """Every world size this session can run: ``1..--nproc``, or torchrun's one size."""
    return _config.world_sizes()


def unavailable_reason(world_size: int) -> str | None:
    """Why ``world_size`` cannot run in this session (``environment: ...``), or ``None``."""
    return _config.unavailable_reason(world_size)


def lost_reason() -> str | None:
    """Why the run cannot go on (in attach mode, a rank is gone), else ``None``."""
    for pool in _pools.values():
        if pool.lost:
            return pool.lost
    return None


def _session_root() -> str:
    global _root
    if _root is None:
        _root = tempfile.mkdtemp(prefix="shardcheck-", dir=_config.shared_dir)
    return _root


def _preload() -> tuple[str, ...]:
    wanted = [_config.strategy.partition(":")[0], "harness.context"]
    wanted += [m for m in ("pytest", "_pytest.assertion.rewrite", "hypothesis") if m in sys.modules]
    return tuple(wanted)


def pool_for(world_size: int) -> RankPool:
    """The session's pool for ``world_size`` (created, not started, on first use): local
    ranks over pipes, or in attach mode torchrun's ranks over its store."""
    pool = _pools.get(world_size)
    if pool is not None:
        return pool
    transport: Transport
    if _config.attach is not None:
        from harness.transports.store import StoreTransport

        # one GPU per local rank of the torchrun node (the backend is the same on every node)
        backend = resolve_backend(_config.backend, _config.attach.local_world_size)
        settings = _pool_settings(world_size, backend)
        transport = StoreTransport(_config.attach)
    else:
        backend = resolve_backend(_config.backend, world_size)
        settings = _pool_settings(world_size, backend, preload=_preload())
        transport = PipeTransport(_session_root(), world_size)
    pool = _pools[world_size] = RankPool(settings, transport)
    return pool


def _pool_settings(world_size: int, backend: str, **extra: Any) -> PoolSettings:
    return PoolSettings(
        world_size=world_size,
        backend=backend,
        pg_timeout=pg_timeout_for(_config.rank_timeout),
        threads=_config.threads,
        failure_grace=_config.failure_grace,
        check_collectives=_config.check_collectives,
        **extra,
    )


def _check_world_size(world_size: Any) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"run_on_ranks(world_size={world_size!r}): expected an int.")
    if world_size < 1:
        raise ValueError(f"run_on_ranks(world_size={world_size}): must be at least 1.")
    if _config.attach is not None and world_size != _config.attach.world_size:
        _refuse_unavailable(world_size)
    if world_size > _config.nproc:
        raise ValueError(
            f"run_on_ranks(world_size={world_size}) is larger than --nproc={_config.nproc}, "
            "the largest world size this session may start; run with a larger --nproc or "
            "mark the test @pytest.mark.world_size(...) so it is skipped."
        )
    return world_size


def _refuse_unavailable(world_size: int) -> None:
    """A job at a world size this attach-mode run does not have: ``environment``.

    Inside a Hypothesis test only this example is dropped (``reject``): an explicit
    ``@example`` at another size must not cost the generated examples that fit. When no
    example fits, the plugin turns Hypothesis' ``Unsatisfiable`` into the skip.
    """
    global _unavailable
    import pytest

    reason = unavailable_reason(world_size)
    assert reason is not None
    _unavailable = reason
    hypothesis = sys.modules.get("hypothesis")
    if hypothesis is not None and hypothesis.currently_in_test_context():
        hypothesis.reject()
    raise pytest.skip.Exception(reason)


def take_unavailable_reason() -> str | None:
    """The reason of the last job refused for its world size (then forgotten), if any."""
    global _unavailable
    reason, _unavailable = _unavailable, None
    return reason


def _check_timeout(timeout: Any, check: str, fn: str) -> float:
    if timeout is None:
        return _deadlines.deadline(check, fn)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"run_on_ranks(timeout={timeout!r}): expected seconds as a number.")
    if not timeout > 0:
        raise ValueError(
            f"run_on_ranks(timeout={timeout}): must be a positive number of seconds "
            "(or None for a deadline learned from the check's passing jobs, at most "
            f"--rank-timeout={_config.rank_timeout})."
        )
    return float(timeout)


def _pickle_args(args: tuple[Any, ...]) -> bytes:
    try:
        return pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"run_on_ranks: the arguments cannot be pickled for the ranks "
            f"({type(exc).__name__}: {exc}); pass plain data or module-level objects."
        ) from exc


def run_on_ranks(
    fn: Callable[..., Any], *args: Any, world_size: int, timeout: float | None = None
) -> list[Any]:
    """Run ``fn(ctx, *args)`` on every rank of the pool of that size; results, index = rank.

    Args:
        fn: a module-level function of an importable module or of a collected test file.
        *args: picklable arguments, the same for every rank.
        world_size: number of ranks (at most ``--nproc``).
        timeout: the job deadline in seconds; ``None`` means one learned from this check's
            passing jobs (:mod:`harness.deadlines`), at most ``--rank-timeout``.

    Raises:
        RankFailure: a rank raised, crashed or hung; the message tells every rank's story.
            A job that hung or broke a collective is replayed once with collective
            checking (as are the check's later jobs): ranks in mismatched collectives raise
            :class:`~harness.verdicts.CollectiveDesync`, ranks left waiting in one
            :class:`~harness.verdicts.CollectiveHang`.
        Unsupported: every rank raised ``Unsupported`` (the strategy refused the config).
        TypeError, ValueError: bad arguments (named in the message).
    """
    global _checked_check
    __tracebackhide__ = True
    ref = fn_ref_of(fn)
    size = _check_world_size(world_size)
    check = current_check(str(ref))
    deadline = _check_timeout(timeout, check, str(ref))
    blob = _pickle_args(args)
    pool = pool_for(size)
    before_job()  # the conformance plugin's shrink budget
    checked = _use_checking(pool, check)
    outcomes, what = _run_job(pool, ref, blob, deadline, size)
    if not checked and _worth_replaying(outcomes) and pool.can_check:
        _checked_check = check  # the replay and the rest of this check run checked
        _use_checking(pool, check)
        outcomes, what = _run_job(pool, ref, blob, deadline, size)
        what += " (replayed with collective checking)"
    _deadlines.learn(check, str(ref), outcomes)
    if all(o.ok for o in outcomes):
        return [o.value for o in outcomes]
    if all(isinstance(o.exception, Unsupported) for o in outcomes):
        raise outcomes[0].exception  # type: ignore[misc]
    failure = failure_for(outcomes, what)
    if isinstance(failure, (CollectiveDesync, CollectiveHang)):
        shrink_once()  # one bug whatever the example's size: shrink it once
    raise failure


def jobs_dispatched() -> int:
    """How many rank jobs this process has dispatched so far (every world size)."""
    return _last_job_id


def _run_job(
    pool: RankPool, ref: FnRef, blob: bytes, deadline: float, size: int
) -> tuple[list[Outcome], str]:
    global _last_job_id
    job_id = _last_job_id = next(_job_ids)
    tmp_dir = os.path.join(_session_root(), "jobs", f"job-{job_id}")
    job = Job(ref, blob, deadline, tmp_dir, _config.strategy, dict(_config.strategy_options))
    what = f"job {job_id}: {ref} at world size {size}"
    try:
        outcomes = pool.run(job, job_id)
    finally:
        if os.path.isdir(tmp_dir):
            shutil.rmtree(tmp_dir, ignore_errors=True)
    publish(outcomes)
    return outcomes, what


def _use_checking(pool: RankPool, check: str) -> bool:
    """Put the pool in the checking mode this check needs; return whether it checks."""
    return pool.set_checking(_config.check_collectives or check == _checked_check)


def _worth_replaying(outcomes: Sequence[Outcome]) -> bool:
    """A hang or a broken collective: what collective checking may name (a rank left alone
    in a collective may be one whose peers passed a mismatched one: gloo lets an all_reduce
    of other shapes through on one side). Not a crash: it is named already (rank, signal,
    fatal error dump), and its peers' broken collectives follow from it."""
    if any(o.kind == "crashed" for o in outcomes):
        return False
    return any(
        o.kind == "hung" or (o.error is not None and o.error.is_distributed) or o.collective_error
        for o in outcomes
    )


def warm_up() -> None:
    """Start the forkserver now: it imports torch in the background, so the first pool
    starts sooner (the plugin calls this at start-up, while pytest collects)."""
    start_forkserver(_preload())


def shutdown(stop_forkserver: bool = False) -> None:
    """Stop every pool (no rank process is left) and remove the session's temp files.

    Args:
        stop_forkserver: also stop multiprocessing's forkserver (at session end).
    """
    global _root
    pools = list(_pools.values())
    _pools.clear()
    for pool in pools:
        pool.stop()
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)
        _root = None
    if stop_forkserver:
        pipes.stop_forkserver()


atexit.register(shutdown, stop_forkserver=True)
