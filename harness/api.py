"""``run_on_ranks`` and the session state behind it: configuration and one pool per size.

The pytest plugin calls :func:`configure` once from the command-line options; scripts and
the benchmark use the defaults (gloo on CPU, ``--nproc`` = GPUs if at least 2, else 4).
Pools start on first use and live until :func:`shutdown` (session end, or interpreter exit).
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing.forkserver
import os
import pickle
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from harness.attach.session import AttachInfo
from harness.attribution import note_late
from harness.contract import DEFAULT_FACTORY, Unsupported
from harness.deadlines import Deadlines, current_check
from harness.fnref import fn_ref_of
from harness.outcomes import Outcome
from harness.pool import PoolSettings, RankPool
from harness.protocol import FnRef, Job
from harness.rankwarnings import COLLECTED
from harness.shrinking import shrink_once
from harness.transport import Transport
from harness.transports.pipes import PipeTransport, forkserver_context
from harness.verdicts import CollectiveDesync, CollectiveHang, failure_for
from harness.worker import pg_timeout_for

__all__ = [
    "HarnessConfig",
    "configure",
    "current_config",
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

BACKENDS = ("auto", "gloo", "nccl")
OutputSink = Callable[[Sequence[Outcome]], None]


def _gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_nproc() -> int:
    """The default ``--nproc``: the number of GPUs if there are at least 2, else 4."""
    gpus = _gpu_count()
    return gpus if gpus >= 2 else 4


@dataclass
class HarnessConfig:
    """Session-wide settings (the plugin fills them from the command line).

    Args:
        nproc: the largest world size a job may use (``--nproc``).
        backend: ``auto``, ``gloo`` or ``nccl`` (``--backend``).
        rank_timeout: the largest job deadline in seconds (``--rank-timeout``); jobs get
            deadlines learned from their check's passing jobs below it.
        strategy: the strategy factory, ``module:callable`` (``--strategy``).
        strategy_options: ``--strategy-option`` values, passed in ``spec.extra``.
        threads: torch intra-op threads per rank.
        failure_grace: seconds the other ranks get to finish after one rank failed.
        attach: the torchrun run this controller drives (attach mode), else ``None``.
        shared_dir: where job directories go (``--shared-dir``; required on several nodes).
        check_collectives: check every job's collectives across ranks
            (``--check-collectives``); otherwise only a failed job's replay and the rest of
            its check are checked (:mod:`harness.collectives`).
    """

    nproc: int = field(default_factory=default_nproc)
    backend: str = "auto"
    rank_timeout: float = 120.0
    strategy: str = field(
        default_factory=lambda: os.environ.get("SHARDCHECK_STRATEGY") or DEFAULT_FACTORY
    )
    strategy_options: dict[str, Any] = field(default_factory=dict)
    threads: int = 1
    failure_grace: float = 3.0
    attach: AttachInfo | None = None
    shared_dir: str | None = None
    check_collectives: bool = False


_config = HarnessConfig()
_pools: dict[int, RankPool] = {}
_root: str | None = None
_job_ids = itertools.count(1)
_last_job_id = 0
_sink: OutputSink | None = None
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
    if new.nproc < 1:
        raise ValueError(f"--nproc={new.nproc} must be at least 1.")
    if new.backend not in BACKENDS:
        raise ValueError(f"--backend={new.backend!r} is not one of {', '.join(BACKENDS)}.")
    if not new.rank_timeout > 0:
        raise ValueError(f"--rank-timeout={new.rank_timeout} must be a positive number of seconds.")
    if new.attach is not None:
        _check_attach(new)
    elif new.backend == "nccl":
        resolve_backend("nccl", new.nproc)
    if new.shared_dir is not None and not os.path.isdir(new.shared_dir):
        raise ValueError(
            f"--shared-dir={new.shared_dir!r} is not a directory; create it on a filesystem "
            "every node mounts at the same path."
        )
    shutdown()
    _config = new
    _reset_learning()
    return new


def _reset_learning() -> None:
    global _deadlines, _checked_check
    _deadlines = Deadlines(ceiling=_config.rank_timeout)
    _checked_check = None


def _check_attach(config: HarnessConfig) -> None:
    info = config.attach
    assert info is not None
    if config.nproc != info.world_size:
        raise ValueError(
            f"--nproc={config.nproc} but torchrun started {info.world_size} ranks; in attach "
            "mode the world size is torchrun's: drop --nproc or make them equal."
        )
    if info.nnodes > 1 and config.shared_dir is None:
        raise ValueError(
            f"attach mode across {info.nnodes} nodes needs --shared-dir DIR on a filesystem "
            "every node mounts at the same path (checkpoint jobs write there)."
        )
    if config.backend == "nccl" and _gpu_count() < info.local_world_size:
        raise ValueError(
            f"--backend nccl needs one GPU per rank: {info.local_world_size} ranks on this node "
            f"but {_gpu_count()} GPU(s) visible; use --backend gloo."
        )


def current_config() -> HarnessConfig:
    """The session settings in force."""
    return _config


def max_world_size() -> int:
    """The largest world size this session may run (``--nproc``, or torchrun's size)."""
    return _config.attach.world_size if _config.attach is not None else _config.nproc


def world_sizes() -> list[int]:
    """Every world size this session can run: ``1..--nproc``, or torchrun's one size."""
    if _config.attach is not None:
        return [_config.attach.world_size]
    return list(range(1, _config.nproc + 1))


def unavailable_reason(world_size: int) -> str | None:
    """Why ``world_size`` cannot run in this session (``environment: ...``), or ``None``."""
    if _config.attach is not None:
        if world_size == _config.attach.world_size:
            return None
        return (
            f"environment: needs world size {world_size} but this attach-mode run has "
            f"torchrun's {_config.attach.world_size} ranks only; start torchrun with "
            f"{world_size} ranks, or run it in local mode (--nproc {max(world_size, 2)})"
        )
    if world_size <= _config.nproc:
        return None
    return (
        f"environment: needs world size {world_size} but --nproc is {_config.nproc}; "
        f"run with --nproc {world_size} or more"
    )


def lost_reason() -> str | None:
    """Why the run cannot go on (in attach mode, a rank is gone), else ``None``."""
    for pool in _pools.values():
        if pool.lost:
            return pool.lost
    return None


def set_output_sink(sink: OutputSink | None) -> OutputSink | None:
    """Route each job's per-rank output to ``sink`` (the plugin's report sections).

    Returns the previous sink. With no sink, output is written to this process's
    stdout/stderr, each line prefixed with its rank.
    """
    global _sink
    previous, _sink = _sink, sink
    return previous


def resolve_backend(backend: str, world_size: int) -> str:
    """``auto`` -> ``nccl`` when there is one GPU per rank, else ``gloo``.

    Args:
        backend: ``auto``, ``gloo`` or ``nccl``.
        world_size: the ranks that need a GPU each on this machine (in attach mode, this
            node's ranks).

    Raises:
        ValueError: ``nccl`` was asked for without one GPU per rank.
    """
    gpus = _gpu_count()
    if backend == "auto":
        return "nccl" if gpus >= world_size and torch.distributed.is_nccl_available() else "gloo"
    if backend == "nccl" and gpus < world_size:
        raise ValueError(
            f"--backend nccl needs one GPU per rank: world size {world_size} but {gpus} GPU(s) "
            "visible; use --backend gloo (CPU) or a smaller --nproc."
        )
    return backend


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
    _publish(outcomes)
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


def _publish(outcomes: Sequence[Outcome]) -> None:
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


def warm_up() -> None:
    """Start the forkserver now: it imports torch in the background, so the first pool
    starts sooner (the plugin calls this at start-up, while pytest collects)."""
    forkserver_context(_preload())
    multiprocessing.forkserver.ensure_running()


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
        _stop_forkserver()


def _stop_forkserver() -> None:
    """Stop multiprocessing's forkserver at once, even while it still imports torch."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if server is None or pid is None or not hasattr(server, "_stop"):
        return
    try:
        os.kill(pid, signal.SIGKILL)  # no rank is left (pools stopped); nothing to wait for
    except ProcessLookupError:
        pass
    server._stop()


atexit.register(shutdown, stop_forkserver=True)
