"""A pool of persistent rank processes: start, dispatch a job, wait, heal.

One :class:`RankPool` per world size. Ranks are forked from a forkserver with torch
preloaded (:mod:`harness.launch`) and rendezvous through a ``TCPStore`` on port 0 that the
controller owns. Every wait goes through ``multiprocessing.connection.wait`` on the ranks'
pipes *and* process sentinels with a deadline, so a crashed rank is noticed at once and a
hung one at the deadline.

Healing (see ``DESIGN.md``): after a rank raised, a health check compares cross-rank state
and runs a short barrier; after a crash or a hang, every live rank dumps its Python stacks,
each rank's process group is killed, and the pool starts again on the next job.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

import torch.distributed as dist

from harness.collectives import waiting_collective
from harness.flight import last_collectives, trace_prefix
from harness.fnref import rewritten_modules
from harness.launch import forkserver_context, kill_rank, spawn_rank
from harness.outcomes import (
    Outcome,
    format_story,
    outcome_from_error,
    outcome_from_result,
    tidy_stacks,
)
from harness.protocol import (
    BARRIER,
    ERROR,
    HEALTHY,
    READY,
    RESULT,
    STATE,
    STOP,
    Command,
    Event,
    Job,
    decode,
    encode,
)
from harness.rankfiles import RankFiles
from harness.stall import StallProbe
from harness.worker import STACK_SIGNAL, WorkerSpec, pg_timeout_for

__all__ = ["PoolSettings", "PoolStartError", "RankPool", "lonely_grace"]


class PoolStartError(RuntimeError):
    """The ranks could not form a process group (each rank's story is in the message)."""


@dataclass(frozen=True)
class PoolSettings:
    """How a pool starts and heals.

    Args:
        world_size: number of ranks.
        backend: ``gloo`` or ``nccl``.
        pg_timeout: initial process-group timeout in seconds.
        threads: torch intra-op threads per rank.
        start_timeout: seconds the ranks get to join the process group.
        failure_grace: seconds the other ranks get to finish once one rank failed.
        health_timeout: seconds the health check (state + barrier) may take.
        preload: extra modules for the forkserver to import.
        warm_up: run a tiny FSDP2 step on every rank at the pool's first start
            (:mod:`harness.warmup`), so the first job is not slower than the rest.
        check_collectives: ranks check every collective across the group
            (:mod:`harness.collectives`); a mismatch raises at once.
        lonely_grace: seconds, at least, that ranks still inside a job get once another
            rank finished it (more for a long job: see :func:`lonely_grace`).
        stall_after: seconds into a job before the waiting ranks' stacks are sampled for a
            stall (:mod:`harness.stall`); 0 turns sampling off.
        stall_every: seconds between two stall samples.
    """

    world_size: int
    backend: str = "gloo"
    pg_timeout: float = 60.0
    threads: int = 1
    start_timeout: float = 120.0
    failure_grace: float = 3.0
    health_timeout: float = 10.0
    preload: tuple[str, ...] = ()
    warm_up: bool = True
    check_collectives: bool = False
    lonely_grace: float = 5.0
    stall_after: float = 3.0
    stall_every: float = 2.0


def lonely_grace(least: float, finished_after: float) -> float:
    """How long ranks still inside a job may take once a rank finished it after
    ``finished_after`` s: ``least``, or twice the finished rank's time for a long job."""
    return max(least, 2.0 * finished_after)


class RankPool:
    """Persistent rank processes for one world size.

    Args:
        settings: see :class:`PoolSettings`.
        root: directory for the pool's per-rank output and stack files.
    """

    def __init__(self, settings: PoolSettings, root: str) -> None:
        self.settings = settings
        self.root = root
        self.generation = 0
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self._lives: list[Connection] = []
        self._store: Any = None
        self.files = RankFiles(os.path.join(root, f"ws{settings.world_size}-g0"), 0)
        self._rewrite: dict[str, str] = {}
        self.respawns = 0

    @property
    def started(self) -> bool:
        """Whether the ranks are up (a killed pool starts again on the next job)."""
        return bool(self.procs)

    @property
    def pids(self) -> list[int]:
        """The rank processes' pids, index = rank (empty when not started)."""
        return [p.pid for p in self.procs]

    def set_checking(self, on: bool) -> None:
        """Check collectives from the next job on (or stop): the ranks start again."""
        if self.settings.check_collectives != on:
            if self.started:
                self.kill()
            self.settings = replace(self.settings, check_collectives=on)

    def start(self) -> float:
        """Start the ranks and wait until all joined; return the seconds it took."""
        began = time.monotonic()
        if self.started:
            return 0.0
        self.generation += 1
        ws = self.settings.world_size
        self.files = RankFiles(os.path.join(self.root, f"ws{ws}-g{self.generation}"), ws)
        context = forkserver_context(self.settings.preload)
        self._store = dist.TCPStore(
            "127.0.0.1",
            0,
            None,
            True,
            wait_for_workers=False,
            timeout=timedelta(seconds=self.settings.start_timeout),
        )
        self._rewrite = rewritten_modules()
        for rank in range(self.settings.world_size):
            self._spawn(context, rank)
        try:
            self._wait_ready(began + self.settings.start_timeout)
        except BaseException:
            self.kill()
            raise
        return time.monotonic() - began

    def _spawn(self, context: Any, rank: int) -> None:
        s = self.settings
        spec = WorkerSpec(
            rank,
            s.world_size,
            s.backend,
            self._store.port,
            s.pg_timeout,
            s.threads,
            self.files.path(rank, "stdout"),
            self.files.path(rank, "stderr"),
            self.files.path(rank, "stacks"),
            self._rewrite,
            s.warm_up and self.generation == 1,  # a respawn heals fast; warm once
            s.check_collectives,
        )
        proc, conn, life = spawn_rank(context, spec)
        self.procs.append(proc)
        self.conns.append(conn)
        self._lives.append(life)

    def _wait_ready(self, deadline: float) -> None:
        outcomes = self._gather(0, time.monotonic(), deadline, kinds=(READY,), grace=None)
        if all(o.ok for o in outcomes):
            return
        self._finish_failed(outcomes)
        what = f"starting the pool of {self.settings.world_size} ranks failed"
        raise PoolStartError(format_story(outcomes, what))

    def run(self, job: Job, job_id: int, what: str) -> list[Outcome]:
        """Run one job on every rank and return the outcomes (the pool heals itself).

        Args:
            job: the job; ``job.timeout`` is its deadline in seconds.
            job_id: the job's id, carried by every message.
            what: how failure messages name the job.
        """
        if self.started and any(p.exitcode is not None for p in self.procs):
            self.kill()  # a rank died between jobs: start afresh rather than blame this job
        if not self.started:
            self.start()
        data = encode(Command("job", job_id, job))
        began = time.monotonic()
        try:
            for conn in self.conns:
                try:
                    conn.send_bytes(data)
                except OSError:
                    pass  # the rank is gone; its sentinel tells the story
            outcomes = self._gather(
                job_id, began, began + job.timeout, (RESULT, ERROR), self.settings.failure_grace
            )
        except BaseException:
            self.kill()  # interrupted (Ctrl-C, pytest-timeout): ranks are mid-job
            raise
        self._heal(outcomes, job_id)
        return outcomes

    def _gather(
        self,
        job_id: int,
        began: float,
        deadline: float,
        kinds: tuple[str, ...],
        grace: float | None,
    ) -> list[Outcome]:
        n = self.settings.world_size
        outcomes: list[Outcome | None] = [None] * n
        owner: dict[Any, int] = {}
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs, strict=True)):
            owner[conn] = owner[proc.sentinel] = rank
        cutoff, why = deadline, f"still running at the deadline ({deadline - began:.1f} s)"
        probe = self._probe(began, grace)
        while None in outcomes:
            now = time.monotonic()
            remaining = cutoff - now
            if remaining <= 0:
                break
            if probe is not None and now >= probe.next_at:
                if self._stalled(probe, outcomes):
                    why = f"stuck in a collective: no progress in {probe.every:.0f} s"
                    break
                continue
            waiting = [obj for obj, rank in owner.items() if outcomes[rank] is None]
            timeout = remaining if probe is None else min(remaining, probe.next_at - now)
            for obj in wait(waiting, max(0.0, timeout)):
                rank = owner[obj]
                if outcomes[rank] is not None:
                    continue
                outcome = self._receive(rank, obj, job_id, kinds, began)
                if outcome is None:
                    continue
                outcomes[rank] = outcome
                if grace is not None and None in outcomes:
                    probe = None  # some rank is out: the grace, not stall sampling, decides
                    seconds, reason = self._grace(outcome, grace)
                    if time.monotonic() + seconds < cutoff:
                        cutoff, why = time.monotonic() + seconds, reason
        elapsed = time.monotonic() - began
        return [
            o or Outcome(r, "hung", detail=why, elapsed=elapsed) for r, o in enumerate(outcomes)
        ]

    def _probe(self, began: float, grace: float | None) -> StallProbe | None:
        s = self.settings
        if grace is None or s.stall_after <= 0:
            return None  # not a job (start, health check)
        return StallProbe(began + s.stall_after, s.stall_every)

    def _stalled(self, probe: StallProbe, outcomes: list[Outcome | None]) -> bool:
        """Sample the stacks of the ranks still in the job: all stuck in collectives?"""
        ranks = [r for r, o in enumerate(outcomes) if o is None]
        if any(self.procs[r].exitcode is not None for r in ranks):
            probe.next_at = time.monotonic() + probe.every  # a dead rank: its sentinel tells
            return False
        for rank in ranks:
            try:
                os.kill(self.procs[rank].pid, STACK_SIGNAL)
            except ProcessLookupError:
                pass
        stacks = self.files.collect_stacks(ranks)
        return probe.sample(time.monotonic(), stacks, self.pids)

    def _grace(self, outcome: Outcome, grace: float) -> tuple[float, str]:
        """How long the ranks still inside the job may take after ``outcome``, and why."""
        if not outcome.ok:
            why = f"rank {outcome.rank} {outcome.kind} (the job had already failed)"
            return grace, f"still running {grace:.1f} s after {why}"
        seconds = lonely_grace(self.settings.lonely_grace, outcome.elapsed)
        return seconds, f"still inside the job {seconds:.1f} s after rank {outcome.rank} finished"

    def _receive(
        self, rank: int, obj: Any, job_id: int, kinds: tuple[str, ...], began: float
    ) -> Outcome | None:
        conn = self.conns[rank]
        if obj is not conn:
            if conn.poll():
                return None  # read the last message first; the sentinel stays ready
            return self._crashed(rank, began)
        try:
            event: Event = decode(conn.recv_bytes())
        except (EOFError, OSError):
            return self._crashed(rank, began)
        if event.job_id != job_id or event.kind not in (*kinds, ERROR):
            return None  # a late reply to an older job
        elapsed = time.monotonic() - began
        if event.kind == ERROR:
            return outcome_from_error(rank, event.payload, elapsed)
        if event.kind == RESULT:
            return outcome_from_result(rank, event.payload, elapsed)
        return Outcome(rank, "ok", value=event.payload, elapsed=elapsed)

    def _crashed(self, rank: int, began: float) -> Outcome:
        elapsed = time.monotonic() - began
        proc = self.procs[rank]
        proc.join(timeout=2.0)
        return Outcome(
            rank,
            "crashed",
            exitcode=proc.exitcode,
            elapsed=elapsed,
            stacks=tidy_stacks(self.files.new_stacks(rank)),
        )

    def _heal(self, outcomes: list[Outcome], job_id: int) -> None:
        self._read_traces(outcomes)
        kinds = {o.kind for o in outcomes}
        if kinds & {"crashed", "hung"}:
            self._finish_failed(outcomes)
            return
        self.files.read_output(outcomes)
        if "raised" not in kinds:
            return
        if any(o.error and o.error.is_distributed for o in outcomes) or not self.healthy(job_id):
            self.kill()

    def _read_traces(self, outcomes: list[Outcome]) -> None:
        """NCCL: each failed rank's last collectives, from its flight-recorder dump."""
        if self.settings.backend != "nccl":
            return
        prefix = trace_prefix(self.files.directory)
        for outcome in outcomes:
            if not outcome.ok:
                outcome.trace = last_collectives(f"{prefix}{outcome.rank}")

    def healthy(self, job_id: int) -> bool:
        """Whether every rank reports the same state and passes a short barrier."""
        began = time.monotonic()
        limit = self.settings.health_timeout
        states = self._ask(Command(STATE, job_id), (STATE,), began + limit / 2)
        if states is None or any(s.value != states[0].value for s in states):
            return False
        barrier = Command(BARRIER, job_id, pg_timeout_for(limit / 2))
        return self._ask(barrier, (HEALTHY,), began + limit) is not None

    def _ask(
        self,
        command: Command,
        kinds: tuple[str, ...],
        deadline: float,
    ) -> list[Outcome] | None:
        data = encode(command)
        try:
            for conn in self.conns:
                conn.send_bytes(data)
            outcomes = self._gather(command.job_id, time.monotonic(), deadline, kinds, None)
        except OSError:
            return None
        return outcomes if all(o.ok for o in outcomes) else None

    def _finish_failed(self, outcomes: list[Outcome]) -> None:
        """After a crash or hang: dump live ranks' stacks, kill every rank, read output."""
        stacks = self._dump_stacks()
        for outcome in outcomes:
            if outcome.kind == "hung":
                dump = tidy_stacks(stacks.get(outcome.rank, ""))
                outcome.stacks = dump or "(no stack dump arrived)"
                outcome.collective = waiting_collective(dump)
        self.kill()
        self.files.read_output(outcomes)

    def _dump_stacks(self) -> dict[int, str]:
        live = [r for r, p in enumerate(self.procs) if p.exitcode is None]
        for rank in live:
            try:
                os.kill(self.procs[rank].pid, STACK_SIGNAL)
            except ProcessLookupError:
                pass
        return self.files.collect_stacks(live)

    def kill(self) -> None:
        """Kill every rank with its process group (children included) and forget them."""
        for proc in self.procs:
            kill_rank(proc.pid)
        self._close(join_timeout=5.0)

    def stop(self, timeout: float = 3.0) -> None:
        """Ask the ranks to leave the process group and exit; kill those that do not."""
        if not self.started:
            return
        data = encode(Command(STOP, 0))
        for conn in self.conns:
            try:
                conn.send_bytes(data)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def _close(self, join_timeout: float) -> None:
        deadline = time.monotonic() + join_timeout
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for conn in (*self.conns, *self._lives):
            conn.close()
        if self.procs:
            self.respawns += 1
        self.procs, self.conns, self._lives = [], [], []
        self._store = None
