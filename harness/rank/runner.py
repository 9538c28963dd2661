"""What a rank runs inside its process group, whichever transport reaches it.

:class:`JobRunner` answers the ``job``, ``state`` and ``barrier`` commands of
:mod:`harness.wire.protocol` with isolation, output capture and a reply that always pickles. The
local ranks (:mod:`harness.rank.worker`, over pipes) and attach mode's torchrun ranks
(:mod:`harness.rank.attached`, over the store) both form their process group with
:func:`join_process_group` and then hand every command to a :class:`JobRunner`.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
import warnings
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import harness.torch_compat as torch_compat
from harness.rank import coverage as rank_coverage
from harness.rank.context import RankContext
from harness.rank.isolation import (
    Baseline,
    OutputCapture,
    capture_warnings,
    cross_rank_state,
    format_warnings,
    warning_records,
)
from harness.rank.usage import UsageGuard
from harness.rank.warmup import tiny_fsdp2_step
from harness.verdicts.attribution import clause_of, take_late_violations
from harness.verdicts.collectives import CollectiveLog, set_checked_timeout
from harness.verdicts.flight import flight_recorder_environ
from harness.wire.fnref import resolve_fn
from harness.wire.protocol import Command, ErrorReport, Event, Job, Kind, Result

__all__ = [
    "JobRunner",
    "join_process_group",
    "pg_timeout_for",
    "rank_device",
    "report_error",
    "warm_up_rank",
]

# the frames a rank's error passes through before the job's own: left out of tracebacks
_RANK_LOOP_FILES = frozenset({__file__, os.path.join(os.path.dirname(__file__), "worker.py")})


def pg_timeout_for(deadline: float) -> float:
    """A process-group timeout safely below the job deadline."""
    return max(0.5, deadline - max(1.0, 0.1 * deadline))


def rank_device(backend: str, local_rank: int) -> torch.device:
    """The device of the rank with node-local rank ``local_rank``, the only one it uses.

    [Note: a rank owns its device] With NCCL it is CUDA device ``local_rank``, made the
    rank's current CUDA device before any strategy code runs (the node's other GPUs stay
    visible, as under torchrun, so a strategy's ``cuda:<LOCAL_RANK>`` names the same device;
    torch's default device mesh keeps a current device that is already set). With any other
    backend it is the CPU, and the rank sees no GPU at all (:func:`hide_cuda`): on a
    machine with fewer GPUs than ranks, torch's default mesh would otherwise pick
    ``cuda:<LOCAL_RANK>`` for a gloo rank (``invalid device ordinal`` on rank 1 of a one-GPU
    machine), and a strategy would put its tensors on a GPU that gloo cannot reduce.
    """
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    hide_cuda()
    return torch.device("cpu")


def hide_cuda() -> None:
    """Hide every CUDA device from this process (``CUDA_VISIBLE_DEVICES=""``).

    CUDA reads the variable once, when it initializes, so this must run before anything in
    the process touched CUDA (the ranks call it before joining their process group).

    Raises:
        RuntimeError: CUDA was initialized already, so the devices cannot be hidden.
    """
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "a gloo rank must see no GPU, but CUDA was initialized in it before the harness "
            "could hide the devices; do not use CUDA at import time in the strategy's module "
            "(or run with --backend nccl)."
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if torch.cuda.is_available():
        raise RuntimeError(
            "a gloo rank must see no GPU, but CUDA_VISIBLE_DEVICES='' did not hide them "
            "(CUDA was probed before the rank started: the device count is cached); "
            "report this with the output of `python -m torch.utils.collect_env`."
        )


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
    collectives and dumps them there on a timeout (:mod:`harness.verdicts.flight`).

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
        checked: whether the process groups check collectives (:mod:`harness.verdicts.collectives`).
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
        self.usage = UsageGuard(self.baseline.collect)  # see [Note: bounded ranks]
        self.current_job = 0
        self.checked = checked
        self.log = CollectiveLog()
        self.log.attach()

    def handle(self, command: Command) -> Event:
        """Answer one ``job``, ``state`` or ``barrier`` command."""
        if command.kind == Kind.JOB:
            return self.run_job(command)
        if command.kind == Kind.STATE:
            return self.state(command)
        if command.kind == Kind.BARRIER:
            return self.barrier(command)
        raise ValueError(f"unknown command {str(command.kind)!r} (job {command.job_id})")

    def _set_pg_timeout(self, seconds: float) -> None:
        if seconds != self.pg_timeout and dist.is_initialized():
            if self.checked:
                set_checked_timeout(seconds)
            else:
                torch_compat.set_default_pg_timeout(seconds)
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
            return self._reply(Kind.ERROR, command.job_id, report, payload)
        if isinstance(payload, BaseException):
            report = report_error(payload, elapsed, warned)
            report = replace(report, warning_records=noted, collective_error=trouble)
            return self._reply(Kind.ERROR, command.job_id, report, payload)
        late = take_late_violations()
        result = Result(payload.value, warned, elapsed, noted, trouble, late)
        return self._reply(Kind.RESULT, command.job_id, result, None)

    def _reply(self, kind: Kind, job_id: int, report: Any, outcome: object) -> Event:
        """The job's reply, with what the rank holds now (see [Note: bounded ranks]).

        ``outcome`` is what the job ended with: its exception, or its :class:`Result` (a
        job that caught a collective mismatch and went on). An exception keeps its frames,
        and so the job's strategy, modules and groups, alive through its traceback: it is
        dropped before the rank's usage is read.
        """
        error = outcome if isinstance(outcome, BaseException) else None  # not a Result
        seen: set[int] = set()
        while error is not None and id(error) not in seen:  # its cause and context too
            seen.add(id(error))
            error.with_traceback(None)  # not an assignment: frozen dataclass errors refuse one
            error = error.__cause__ or error.__context__
        return Event(kind, job_id, self.rank, report, self.usage.after_job())

    def state(self, command: Command) -> Event:
        """Report the state the health check compares across ranks."""
        return Event(Kind.STATE, command.job_id, self.rank, cross_rank_state())

    def barrier(self, command: Command) -> Event:
        """Join a barrier with a short timeout: proves every rank still talks."""
        start = time.perf_counter()
        try:
            self._set_pg_timeout(float(command.payload))
            dist.barrier()
        except BaseException as exc:
            return Event(Kind.ERROR, command.job_id, self.rank, report_error(exc, 0.0, ""))
        return Event(Kind.HEALTHY, command.job_id, self.rank, time.perf_counter() - start)


def _desync_error(log: Any, payload: Any) -> BaseException:
    """The job's error, or (the job caught the mismatch and went on) the mismatch itself."""
    if isinstance(payload, BaseException):
        return payload
    return RuntimeError(f"the job caught a collective mismatch and went on: {log.message}")


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
    """An exception as an :class:`ErrorReport` (traceback without the rank loop's frames)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _RANK_LOOP_FILES:
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
