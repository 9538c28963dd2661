"""The rank process: join the process group once, then run jobs until told to stop.

A worker is forked from the forkserver (torch and the distributed modules already
imported), becomes the leader of its own process group (so the controller can kill it with
everything it started), points stdout/stderr at per-rank files, arms ``faulthandler`` (fatal
signals and ``SIGUSR1`` dump Python stacks to a per-rank file), joins the default process
group through the controller's store, and then serves :mod:`harness.protocol` commands.
A watchdog thread kills the rank's process group when the controller's end of the life
pipe closes, so a dead controller never leaves ranks behind.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field, replace
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from harness.attribution import clause_of, take_late_violations
from harness.collectives import CollectiveLog, install_checking, set_checked_timeout
from harness.context import RankContext
from harness.flight import flight_recorder_environ, trace_prefix
from harness.fnref import install_rewriting, resolve_fn
from harness.isolation import (
    Baseline,
    OutputCapture,
    capture_warnings,
    cross_rank_state,
    format_warnings,
    warning_records,
)
from harness.protocol import (
    BARRIER,
    ERROR,
    HEALTHY,
    JOB,
    READY,
    RESULT,
    STATE,
    STOP,
    Command,
    ErrorReport,
    Event,
    Job,
    Result,
    decode,
    encode,
)
from harness.rankcoverage import rank as rank_coverage
from harness.warmup import tiny_fsdp2_step

__all__ = [
    "JobRunner",
    "WorkerSpec",
    "join_process_group",
    "launcher_environ",
    "pg_timeout_for",
    "report_error",
    "warm_up_rank",
    "worker_main",
]

STACK_SIGNAL = signal.SIGUSR1


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a rank needs to start.

    Args:
        rank: this rank.
        world_size: the pool's world size.
        backend: ``gloo`` or ``nccl``.
        store_port: port of the controller's TCPStore on 127.0.0.1.
        pg_timeout: initial process-group timeout in seconds (set per job later).
        threads: torch intra-op threads for this rank.
        stdout_path: per-rank stdout capture file.
        stderr_path: per-rank stderr capture file.
        stacks_path: per-rank file for faulthandler's stack dumps.
        rewrite: modules (name -> path) to import with pytest's assertion rewriting.
        warm_up: run :func:`harness.warmup.tiny_fsdp2_step` once before reporting ready.
        check_collectives: wrap every process group in torch's collective checker
            (:mod:`harness.collectives`), so ranks entering different collectives raise.
    """

    rank: int
    world_size: int
    backend: str
    store_port: int
    pg_timeout: float
    threads: int
    stdout_path: str
    stderr_path: str
    stacks_path: str
    rewrite: dict[str, str] = field(default_factory=dict)
    warm_up: bool = True
    check_collectives: bool = False


def pg_timeout_for(deadline: float) -> float:
    """A process-group timeout safely below the job deadline."""
    return max(0.5, deadline - max(1.0, 0.1 * deadline))


def worker_main(spec: WorkerSpec, conn: Connection, life: Connection) -> None:
    """Entry point of a rank process (the target of ``multiprocessing.Process``)."""
    own_group = _become_group_leader()
    rank_coverage.start_from_env(spec.rank)  # no-op unless --rank-coverage
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_controller(life, own_group)
    capture = OutputCapture(spec.stdout_path, spec.stderr_path)
    stacks = open(spec.stacks_path, "a")
    faulthandler.enable(stacks, all_threads=True)
    faulthandler.register(STACK_SIGNAL, stacks, all_threads=True, chain=False)
    try:
        rank = _Rank(spec, conn, capture)
    except BaseException as exc:
        conn.send_bytes(encode(Event(ERROR, 0, spec.rank, report_error(exc, 0.0, ""))))
        capture.flush()
        os._exit(1)
    conn.send_bytes(encode(Event(READY, 0, spec.rank, os.getpid())))
    rank.serve()


def _become_group_leader() -> bool:
    try:
        os.setpgid(0, 0)
    except OSError:
        return False
    return os.getpgid(0) == os.getpid()


def _watch_controller(life: Connection, own_group: bool) -> None:
    def watch() -> None:
        try:
            life.recv_bytes()
        except (EOFError, OSError):
            pass
        if own_group:
            os.killpg(0, signal.SIGKILL)
        os._exit(70)

    threading.Thread(target=watch, name="shardcheck-watchdog", daemon=True).start()


class _Rank:
    """One local rank: joins the default process group, then answers commands on its pipe."""

    def __init__(self, spec: WorkerSpec, conn: Connection, capture: OutputCapture) -> None:
        self.spec = spec
        self.conn = conn
        os.environ.update(launcher_environ(spec.rank, spec.world_size))
        torch.set_num_threads(spec.threads)
        install_rewriting(spec.rewrite)
        device = _device(spec)
        store = dist.TCPStore(
            "127.0.0.1",
            spec.store_port,
            spec.world_size,
            is_master=False,
            timeout=timedelta(seconds=max(spec.pg_timeout, 30.0)),
        )
        trace = trace_prefix(os.path.dirname(spec.stacks_path))
        args = (spec.backend, store, spec.rank, spec.world_size, spec.pg_timeout, device, trace)
        if spec.check_collectives:
            install_checking()(lambda: join_process_group(*args))
        else:
            join_process_group(*args)
        if spec.warm_up:
            warm_up_rank(device)
        self.runner = JobRunner(
            spec.rank,
            spec.world_size,
            spec.backend,
            device,
            capture,
            spec.pg_timeout,
            spec.check_collectives,
        )

    def serve(self) -> None:
        """Answer commands until ``stop`` or until the controller's pipe closes."""
        while True:
            try:
                command: Command = decode(self.conn.recv_bytes())
            except (EOFError, OSError):
                break
            if command.kind == STOP:
                break
            self.conn.send_bytes(encode(self.runner.handle(command)))
        self.runner.capture.flush()
        if dist.is_initialized():
            dist.destroy_process_group()


def launcher_environ(rank: int, world_size: int) -> dict[str, str]:
    """The variables torchrun gives a rank of a one-node run, for strategies that read them
    (``LOCAL_RANK`` picks the CUDA device; ``CUDA_VISIBLE_DEVICES`` is inherited as it is)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
    }


def join_process_group(
    backend: str,
    store: Any,
    rank: int,
    world_size: int,
    pg_timeout: float,
    device: torch.device,
    trace: str | None = None,
) -> None:
    """Initialize the default process group through ``store`` (NCCL binds ``device``).

    With NCCL and ``trace`` (a file prefix), torch's flight recorder keeps the rank's last
    collectives and dumps them there on a timeout (:mod:`harness.flight`).

    With NCCL, a collective that outlives the process group's timeout (set below each job's
    deadline) must raise in the job rather than tear the process down (NCCL's default, and
    torchrun's setting): blocking waits raise on timeout, and the watchdog only aborts the
    communicator. A torn-down rank is a crash the local pool heals by respawning, but attach
    mode cannot replace it.
    """
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = device
        os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
        if trace is not None:
            os.environ.update(flight_recorder_environ(trace))
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=pg_timeout),
        **kwargs,
    )


def warm_up_rank(device: torch.device) -> None:
    """One tiny FSDP2 step (first-use costs paid before the first job), then a barrier."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny_fsdp2_step(device)
    dist.barrier()


class JobRunner:
    """Runs the commands of one rank inside an initialized default process group.

    Shared by the local pool's ranks (pipes) and attach mode's ranks (the torchrun store).

    Args:
        rank: this rank.
        world_size: the world size.
        backend: the process-group backend.
        device: this rank's device.
        capture: where this rank's stdout/stderr go (emptied per job).
        pg_timeout: the process group's timeout in seconds now (set per job later).
        checked: whether the process groups check collectives (:mod:`harness.collectives`).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        backend: str,
        device: torch.device,
        capture: OutputCapture,
        pg_timeout: float,
        checked: bool = False,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.device = device
        self.capture = capture
        self.pg_timeout = pg_timeout
        self.baseline = Baseline()
        self.current_job = 0
        self.checked = checked
        self.log = CollectiveLog()
        self.log.attach()

    def handle(self, command: Command) -> Event:
        """Answer one ``job``, ``state`` or ``barrier`` command."""
        if command.kind == JOB:
            return self.run_job(command)
        if command.kind == STATE:
            return self.state(command)
        if command.kind == BARRIER:
            return self.barrier(command)
        raise ValueError(f"unknown command {command.kind!r} (job {command.job_id})")

    def _set_pg_timeout(self, seconds: float) -> None:
        if seconds != self.pg_timeout and dist.is_initialized():
            if self.checked:
                set_checked_timeout(seconds)
            else:
                dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds))
            self.pg_timeout = seconds

    def run_job(self, command: Command) -> Event:
        """Run one job with isolation, output capture and a picklable reply."""
        job: Job = command.payload
        self.capture.start_job()
        ctx = RankContext(
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
            backend=self.backend,
            job_dir=job.tmp_dir,
            job_id=command.job_id,
            factory=job.factory,
            strategy_options=job.strategy_options,
        )
        start = time.perf_counter()
        self.current_job = command.job_id
        self.log.clear()
        take_late_violations()  # a violation left over from an aborted job is not this job's
        with capture_warnings() as records:
            try:
                self.baseline.reset()
                self._set_pg_timeout(pg_timeout_for(job.timeout))
                value = _call(job, ctx)
                payload: Any = Result(_pickle_result(value, ctx.rank), "", 0.0)
            except BaseException as exc:
                payload = exc
            finally:
                self.current_job = 0
        elapsed = time.perf_counter() - start
        warned = format_warnings(records) if records else ""
        noted = warning_records(records)
        self.capture.flush()
        try:
            self.baseline.cleanup()
        except Exception as exc:  # reported: the job left state the harness cannot undo
            payload = exc
        rank_coverage.save()  # no-op unless --rank-coverage; a killed rank keeps its data
        desync, trouble = self.log.first, self.log.error
        if desync is not None:
            report = report_error(_desync_error(self.log, payload), elapsed, warned)
            report = replace(report, desync=desync, is_distributed=True, warning_records=noted)
            return Event(ERROR, command.job_id, ctx.rank, report)
        if isinstance(payload, BaseException):
            report = report_error(payload, elapsed, warned)
            report = replace(report, warning_records=noted, collective_error=trouble)
            return Event(ERROR, command.job_id, ctx.rank, report)
        late = take_late_violations()
        result = Result(payload.value, warned, elapsed, noted, trouble, late)
        return Event(RESULT, command.job_id, ctx.rank, result)

    def state(self, command: Command) -> Event:
        """Report the state the health check compares across ranks."""
        return Event(STATE, command.job_id, self.rank, cross_rank_state())

    def barrier(self, command: Command) -> Event:
        """Join a barrier with a short timeout: proves every rank still talks."""
        start = time.perf_counter()
        try:
            self._set_pg_timeout(float(command.payload))
            dist.barrier()
        except BaseException as exc:
            return Event(ERROR, command.job_id, self.rank, report_error(exc, 0.0, ""))
        return Event(HEALTHY, command.job_id, self.rank, time.perf_counter() - start)


def _desync_error(log: Any, payload: Any) -> BaseException:
    """The job's error, or (the job caught the mismatch and went on) the mismatch itself."""
    if isinstance(payload, BaseException):
        return payload
    return RuntimeError(f"the job caught a collective mismatch and went on: {log.message}")


def _device(spec: WorkerSpec) -> torch.device:
    if spec.backend == "nccl":
        torch.cuda.set_device(spec.rank)
        return torch.device("cuda", spec.rank)
    return torch.device("cpu")


def _call(job: Job, ctx: RankContext) -> Any:
    fn = resolve_fn(job.fn)
    args = pickle.loads(job.args)
    return fn(ctx, *args)


def _pickle_result(value: Any, rank: int) -> bytes:
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"the return value of rank {rank} is not picklable ({type(exc).__name__}: {exc}); "
            "return plain data (numbers, strings, tensors, dicts/lists of them)."
        ) from None


def report_error(exc: BaseException, elapsed: float, warned: str) -> ErrorReport:
    """An exception as an :class:`ErrorReport` (traceback without the worker's frames)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
    try:
        blob: bytes | None = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        blob = None
    cls = type(exc)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    message = str(exc)
    # gloo raises plain RuntimeErrors; an assertion whose message merely names the backend
    # (a RankContext's repr) is not one
    is_dist = isinstance(exc, dist.DistError) or (
        type(exc) is RuntimeError and "gloo" in message.lower()
    )
    return ErrorReport(name, message, text, blob, is_dist, warned, elapsed, clause=clause_of(exc))
