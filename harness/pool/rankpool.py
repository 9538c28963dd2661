"""The rank pool of one world size: dispatch a job, wait with deadlines, check health, heal.

:class:`RankPool` is the policy, written once; a :class:`~harness.pool.transport.Transport` carries
it out (local ranks over pipes, or torchrun's ranks over its store; see
docs/architecture.md). A job is sent to every rank, and the replies are polled until every rank
answered or the cutoff passed: the job's deadline, brought forward when a rank fails (the
others get ``failure_grace``) or, where ranks can be replaced, when a rank finished and the
others linger (:func:`lonely_grace`) or all sit stalled in collectives
(:mod:`harness.pool.stall`), and never later than the job's ``bound`` (its test's time: see
:mod:`harness.run.budget`). A rank still inside the job then is ``hung``.

Healing: after a rank raised, a health check compares cross-rank state and runs a short
barrier; when it fails (or a collective did) the pool ends the generation of ranks or of
their process group. After a crash or a hang, the hung ranks' stacks are dumped first. The
next generation starts with the next job, or at once where the transport cannot replace
ranks. What cannot heal makes the pool *lost*: every later job raises :class:`PoolLost`
(the plugin then ends the session, so the report is still written).

[Note: heals are counted] Each generation that ends early is a *heal*, kept with its cause
(:attr:`RankPool.heals`): a crashed rank, a hang, a broken process group (a collective
failed or the health check did), a rank that died between jobs, or a start that failed. The
session takes them after each job with the check they happened in
(:meth:`harness.run.session.HarnessSession.note_heals`), and the terminal summary and the report
count them per world size. A switch of collective checking and the end of the run are not
heals.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from harness.pool.progress import EXTENSION_FLOOR, WINDOW, Sample, progress, take_sample
from harness.pool.stall import StallProbe, cpu_seconds
from harness.pool.transport import Bound, PoolSettings, RanksUnreachable, StackDump, Transport
from harness.pool.usage import PoolUsage
from harness.rank.runner import pg_timeout_for
from harness.verdicts.collectives import waiting_collective
from harness.verdicts.outcomes import (
    STUCK_DETAIL,
    Outcome,
    format_story,
    outcome_from_reply,
    tidy_stacks,
)
from harness.wire.protocol import Command, Job, Kind

__all__ = [
    "PoolLost",
    "PoolSettings",
    "PoolStartError",
    "RankPool",
    "lonely_grace",
    "switches_line",
]


class PoolStartError(RuntimeError):
    """The ranks could not form a process group (each rank's story is in the message)."""


class PoolLost(RuntimeError):
    """The pool cannot run jobs any more (the message says why): the session must end."""


def lonely_grace(least: float, finished_after: float) -> float:
    """How long ranks still inside a job may take once a rank finished it after
    ``finished_after`` s: ``least``, or twice the finished rank's time for a long job."""
    return max(least, 2.0 * finished_after)


def switches_line(switches: Mapping[int, Sequence[float]], attached: bool) -> str:
    """One line for the end of the run: how often the ranks' process group was formed again
    for another world size and what that cost (attach mode's sub-worlds; ``""`` in local
    mode, where no pool takes another's ranks).

    Args:
        switches: the seconds of each switch, by the world size switched to.
        attached: whether the run is in attach mode (then the line is printed even without
            a switch).
    """
    seconds = [s for _, taken in sorted(switches.items()) for s in taken]
    if not seconds:
        return "attach mode: no process group switch (every job ran at one world size)" * attached
    sizes = ", ".join(f"to {size}: {len(t)}" for size, t in sorted(switches.items()) if t)
    total = sum(seconds)
    return (
        f"attach mode switched the ranks' process group between world sizes {len(seconds)} "
        f"time{'s' if len(seconds) != 1 else ''} ({sizes}): {total / len(seconds):.2f} s per "
        f"switch on average, {max(seconds):.2f} s at most, {total:.1f} s in all"
    )


class RankPool:
    """The ranks of one world size, reached through ``transport``.

    Args:
        settings: see :class:`PoolSettings`.
        transport: how the ranks are started and reached (its ``world_size`` must match).

    Raises:
        ValueError: the transport has another number of ranks than ``settings.world_size``.
    """

    def __init__(self, settings: PoolSettings, transport: Transport) -> None:
        if transport.world_size != settings.world_size:
            raise ValueError(
                f"a pool of world size {settings.world_size} cannot run on the "
                f"{transport.world_size} {transport.name} ranks; make the two equal."
            )
        self.settings = settings
        self.transport = transport
        self.generation = 0
        self.started = False
        self.lost: str | None = None
        self.respawns = 0
        #: why generations ended early since :meth:`take_heals` was last called, in order:
        #: ``crash``, ``hang``, ``broken group``, ``died between jobs``, ``start failure``,
        #: ``recycled (... over the bound)``
        self.heals: list[str] = []
        #: what the ranks held over the run (see [Note: bounded ranks] in harness.rank.usage)
        self.usage = PoolUsage()
        #: why each job cutoff moved on because its ranks still worked (see [Note: slow is
        #: not hung] in harness.pool.progress), in order
        self.cutoffs_moved: list[str] = []
        #: the seconds each start spent forming this pool's group over ranks another pool's
        #: group held (attach mode's sub-worlds: the slowest rank's time to leave the old
        #: group and join the new, as its ``ready`` says); the session keeps them per size
        self.switches: list[float] = []
        self._job_cpu: dict[int, float] = {}  # each rank's CPU seconds as the job was sent
        self._cpu_pids: list[int] = []  # the ranks ``_job_cpu`` belongs to
        self._job_deadline = float("inf")  # the running job's deadline, seconds
        self._bound: Bound | None = None  # the running job's final cutoff (its test's time)

    def take_heals(self) -> list[str]:
        """The causes of the generations that ended early since the last call (then
        forgotten): each is one restart of the ranks (see [Note: heals are counted])."""
        heals, self.heals = self.heals, []
        return heals

    @property
    def pids(self) -> list[int]:
        """The rank processes' pids on this machine, index = rank (empty when none)."""
        return self.transport.pids

    @property
    def can_check(self) -> bool:
        """Whether jobs can run with collective checking (it is installed per process, so
        only where the transport starts fresh ranks)."""
        return self.transport.replaces_ranks

    def set_checking(self, on: bool) -> bool:
        """Check collectives from the next job on (or stop; the ranks start again); return
        whether the next job checks them."""
        if not self.can_check:
            return False
        if self.settings.check_collectives != on:
            self.kill()
            self.settings = replace(self.settings, check_collectives=on)
        return on

    def _check_usable(self) -> None:
        if self.lost is not None:
            raise PoolLost(self.lost)

    def start(self) -> float:
        """Start a generation and wait until every rank joined; return the seconds it took
        (0 when the ranks are up already).

        Raises:
            PoolStartError: a rank could not join (when the transport cannot replace ranks,
                the pool is lost as well).
            PoolLost: the pool was lost before.
        """
        self._check_usable()
        if self.started:
            return 0.0
        began = time.monotonic()
        switch = self.transport.taken()
        self.generation += 1
        settings = self.settings
        if self.generation > 1:
            settings = replace(settings, warm_up=False)  # a respawn heals fast; warm once
        try:
            token = self.transport.start(self.generation, settings)
        except BaseException:
            self.kill()  # ranks started before the failure must not linger
            raise
        # [Note: a failed start ends in seconds] a rank that fails while joining (its device,
        # its store, the warm-up step) leaves the others waiting in a rendezvous or a
        # collective that cannot complete: they get the failure grace, not the whole deadline
        outcomes = self._wait(
            token,
            began,
            began + settings.start_timeout,
            (Kind.READY,),
            settings.failure_grace,
            lonely=False,
            bound=self._bound,
        )
        if not all(o.ok for o in outcomes):
            n, name = self.settings.world_size, self.transport.name
            story = format_story(
                outcomes, f"forming process group {self.generation} of {n} {name} ranks failed"
            )
            self._end_failed(token, outcomes, None if self.transport.replaces_ranks else story)
            self.heals.append("start failure")
            raise PoolStartError(story)
        self.transport.done(token, outcomes)
        self.started = True
        seconds = time.monotonic() - began
        if switch:  # what re-forming the group took the ranks (not a first warm-up step)
            spent = [o.value for o in outcomes if isinstance(o.value, float)]
            self.switches.append(max(spent, default=seconds))
        elif self.generation > 1:
            self.respawns += 1
        return seconds

    def run(self, job: Job, job_id: int, bound: Bound | None = None) -> list[Outcome]:
        """Run one job on every rank and return the outcomes (the pool heals itself).

        Args:
            job: the job; ``job.timeout`` is its deadline in seconds.
            job_id: the job's id, carried by every message.
            bound: the final cutoff of the job and of a start of the ranks before it
                (its test's time), whatever else would move it later.

        Raises:
            PoolLost: the pool was lost before this job, or while it ran (the store is gone).
        """
        self._check_usable()
        self._bound = bound
        try:
            if self.started and self.transport.taken():
                self.started = False  # another world size's group holds the ranks: a switch
            if self.started and not self.transport.alive():
                self.heals.append("died between jobs")
                self.kill()  # a rank died between jobs: start afresh rather than blame this job
            self.start()
            began = time.monotonic()
            self._note_job_start(job.timeout)
            token = self.transport.send(Command(Kind.JOB, job_id, job))
            grace = self.settings.failure_grace
            outcomes = self._wait(
                token, began, began + job.timeout, (Kind.RESULT, Kind.ERROR), grace, bound=bound
            )
            self._heal(token, outcomes, job_id)
            self._note_job_end(outcomes)
            self._recycle_if_asked(outcomes)
        except RanksUnreachable as exc:
            self.lost = str(exc)
            raise PoolLost(self.lost) from None
        finally:
            self._bound = None
        return outcomes

    def _note_job_start(self, deadline: float) -> None:
        """The ranks' CPU seconds as a job is sent, and its deadline (see [Note: slow is not
        hung]): what a rank spent in the job is told from them at a cutoff. A rank reports
        its CPU seconds with each reply (a rank waiting for a job uses none), so ``/proc``
        is read only for the first job of a generation."""
        self._job_deadline = deadline
        if not self.transport.replaces_ranks:
            return
        pids = self.transport.pids
        if pids != self._cpu_pids:  # a new generation
            self._cpu_pids = list(pids)
            self._job_cpu = {}
            for rank, pid in enumerate(pids):
                cpu = cpu_seconds(pid)
                if cpu is not None:
                    self._job_cpu[rank] = cpu

    def _note_job_end(self, outcomes: list[Outcome]) -> None:
        """Keep each rank's CPU seconds after the job: the next job's start."""
        for outcome in outcomes:
            if outcome.usage is not None:
                self._job_cpu[outcome.rank] = outcome.usage.cpu_s

    def _recycle_if_asked(self, outcomes: list[Outcome]) -> None:
        """Replace the ranks when one holds more than its bound after a job (see [Note:
        bounded ranks] in :mod:`harness.rank.usage`): a heal, whose cause says what."""
        over = self.usage.note(outcomes)
        if over and self.started:
            self.heals.append(f"recycled ({over} over the bound)")
            self.kill()
            self._reform()

    def _wait(
        self,
        token: int,
        began: float,
        deadline: float,
        kinds: tuple[Kind, ...],
        grace: float | None,
        lonely: bool = True,
        bound: Bound | None = None,
    ) -> list[Outcome]:
        """:meth:`_gather`, ending the generation when interrupted (Ctrl-C, pytest-timeout)."""
        try:
            return self._gather(token, began, deadline, kinds, grace, lonely, bound)
        except RanksUnreachable:
            raise
        except BaseException:
            self.kill(token)  # the ranks are inside the command: they start again
            raise

    def _gather(
        self,
        token: int,
        began: float,
        deadline: float,
        kinds: tuple[Kind, ...],
        grace: float | None,
        lonely: bool = True,
        bound: Bound | None = None,
    ) -> list[Outcome]:
        """Every rank's outcome of command ``token``: its reply of one of ``kinds`` (or an
        error), a crash, or ``hung`` when the cutoff passed first. ``grace`` brings the
        cutoff forward once a rank is out: after a failed rank always, after one that
        finished only when ``lonely`` (jobs; at the start ranks finish as they are ready).
        A job's cutoff (its deadline, or the grace after a rank finished) moves on while
        the ranks still inside it work (see [Note: slow is not hung]), never past
        ``bound``, the test's time (see [Note: the test's time budget] in
        :mod:`harness.run.budget`)."""
        outcomes: list[Outcome | None] = [None] * self.settings.world_size
        cutoff, why = deadline, f"still running at the deadline ({deadline - began:.1f} s)"
        probe = self._probe(began, grace) if lonely else None
        patient = probe is not None  # a job whose ranks can be sampled: cutoffs may move
        limit = max(deadline, began + self.settings.rank_timeout)
        if bound is not None and bound.at < limit:
            limit = bound.at
            if bound.at <= cutoff:
                cutoff, why = bound.at, bound.why
        before: Sample | None = None  # the first sample of the window before the cutoff
        moved: list[str] = []  # why the cutoff moved on, each time
        while None in outcomes:
            now = time.monotonic()
            pending = [rank for rank, o in enumerate(outcomes) if o is None]
            if now >= cutoff:
                if cutoff >= limit:
                    break  # the last cutoff: whether the ranks still work changes nothing
                alone = len(pending) < len(outcomes)  # others are out: the machine is no excuse
                own = None if alone else self.settings.world_size
                working = self._working(token, pending, before, own) if patient else ""
                if not working:
                    break
                step = max(EXTENSION_FLOOR, deadline - began)
                cutoff, before = min(limit, time.monotonic() + step), None
                if bound is not None and cutoff >= bound.at:
                    why = bound.why
                moved.append(working)
                self.cutoffs_moved.append(working)
                continue
            if patient and before is None and now >= cutoff - WINDOW:
                before = self._sample(token, pending)
                continue
            if probe is not None and now >= probe.next_at:
                if self._stalled(probe, token, pending):
                    why = f"{STUCK_DETAIL}: no progress in {probe.every:.0f} s"
                    break
                continue
            wake = cutoff - WINDOW if patient and before is None else cutoff
            if probe is not None:
                wake = min(wake, probe.next_at)
            for reply in self.transport.poll(token, pending, max(0.0, wake - now)):
                outcome = outcome_from_reply(reply, kinds, time.monotonic() - began)
                if outcome is None or outcomes[reply.rank] is not None:
                    continue
                outcomes[reply.rank] = outcome
                if grace is not None and None in outcomes and (lonely or not outcome.ok):
                    probe = None  # some rank is out: the grace, not stall sampling, decides
                    patient = patient and outcome.ok  # after a failure the grace is firm
                    seconds, reason = self._grace(outcome, grace)
                    if time.monotonic() + seconds < cutoff:
                        cutoff, why, before = time.monotonic() + seconds, reason, None
        elapsed = time.monotonic() - began
        if moved:
            why += f"; the cutoff had moved on {len(moved)} time(s) while {moved[0]}"
        return [
            o or Outcome(r, "hung", detail=why, elapsed=elapsed) for r, o in enumerate(outcomes)
        ]

    def _sample(self, token: int, ranks: list[int]) -> Sample:
        """The ranks still inside the job now (see [Note: slow is not hung])."""

        def stacks(wanted: Sequence[int]) -> dict[int, str]:
            dumps = self.transport.dump_stacks(token, list(wanted))
            return {rank: dump.stacks for rank, dump in dumps.items()}

        return take_sample(time.monotonic(), ranks, self.transport.pids, stacks)

    def _spent(self, sample: Sample) -> dict[int, float]:
        """CPU seconds each sampled rank used since the job was sent."""
        return {
            rank: cpu - self._job_cpu.get(rank, cpu)
            for rank, cpu in sample.cpu.items()
            if cpu is not None
        }

    def _working(self, token: int, ranks: list[int], before: Sample | None, own: int | None) -> str:
        """Why the ranks still inside the job at its cutoff count as working (``""``: they
        wait; ``own``: see :func:`progress`). Without a sample from before the cutoff, one
        is taken and the window waited."""
        if before is None:
            before = self._sample(token, ranks)
            time.sleep(WINDOW)
        after = self._sample(token, ranks)
        return progress(before, after, own, self._spent(after), self._job_deadline)

    def _probe(self, began: float, grace: float | None) -> StallProbe | None:
        s = self.settings
        if grace is None or s.stall_after <= 0 or not self.transport.replaces_ranks:
            return None  # not a job (start, health check), or its ranks cannot be ended early
        return StallProbe(began + s.stall_after, s.stall_every)

    def _stalled(self, probe: StallProbe, token: int, ranks: list[int]) -> bool:
        """Sample the stacks of the ranks still in the job: all stuck in collectives?"""
        dumps = self.transport.dump_stacks(token, ranks)
        stacks = {rank: dump.stacks for rank, dump in dumps.items()}
        return probe.sample(time.monotonic(), stacks, self.transport.pids)

    def _grace(self, outcome: Outcome, grace: float) -> tuple[float, str]:
        """How long the ranks still inside the job may take after ``outcome``, and why."""
        if not outcome.ok:
            why = f"rank {outcome.rank} {outcome.kind}"
            return grace, f"still running {grace:.1f} s after {why}"
        if not self.transport.replaces_ranks:
            return float("inf"), ""  # its ranks leave a job by themselves: the deadline decides
        seconds = lonely_grace(self.settings.lonely_grace, outcome.elapsed)
        return seconds, f"still inside the job {seconds:.1f} s after rank {outcome.rank} finished"

    def _heal(self, token: int, outcomes: list[Outcome], job_id: int) -> None:
        kinds = {o.kind for o in outcomes}
        if kinds & {"crashed", "hung"}:
            self.heals.append("crash" if "crashed" in kinds else "hang")
            crashed = [o.rank for o in outcomes if o.kind == "crashed"]
            lost = None
            if crashed and not self.transport.replaces_ranks:
                lost = (
                    f"rank(s) {crashed} crashed or went silent during job {job_id}; "
                    f"{self.transport.name} ranks cannot be replaced inside a run, so the run "
                    "ends here"
                )
            self._end_failed(token, outcomes, lost)
            self._reform()
            return
        self.transport.done(token, outcomes)
        if "raised" not in kinds:
            return
        if any(o.error and o.error.is_distributed for o in outcomes) or not self.healthy(job_id):
            self.heals.append("broken group")
            self.kill()
            self._reform()

    def _end_failed(self, token: int, outcomes: list[Outcome], lost: str | None) -> None:
        """After a crash or a hang: dump the hung ranks' stacks, end the generation.

        Args:
            lost: why the pool cannot go on, if known already (the hung ranks are then not
                waited for).
        """
        hung = [o for o in outcomes if o.kind == "hung"]
        dumps = self.transport.dump_stacks(token, [o.rank for o in hung]) if hung else {}
        for outcome in hung:
            dump = dumps.get(outcome.rank, StackDump(""))
            stacks = tidy_stacks(dump.stacks)
            outcome.stacks = stacks or "(no stack dump arrived)"
            outcome.collective = waiting_collective(stacks)
            outcome.stdout, outcome.stderr = dump.stdout, dump.stderr
        late = [] if lost else [o.rank for o in hung]
        self.lost = self.transport.recover(token, late) or lost
        self.started = False
        self.transport.done(token, outcomes)

    def _reform(self) -> None:
        """Start the next generation now where ranks cannot be replaced, so a rank that
        cannot rejoin ends the run before the next test; else the next job starts it."""
        if self.transport.replaces_ranks or self.lost is not None:
            return
        try:
            self.start()
        except PoolStartError:
            pass  # self.lost holds the story; the next job raises PoolLost

    def healthy(self, job_id: int) -> bool:
        """Whether every rank reports the same state and passes a short barrier."""
        began = time.monotonic()
        limit = self.settings.health_timeout
        states = self._ask(Command(Kind.STATE, job_id), (Kind.STATE,), began + limit / 2)
        if states is None or any(s.value != states[0].value for s in states):
            return False
        barrier = Command(Kind.BARRIER, job_id, pg_timeout_for(limit / 2))
        return self._ask(barrier, (Kind.HEALTHY,), began + limit) is not None

    def _ask(
        self, command: Command, kinds: tuple[Kind, ...], deadline: float
    ) -> list[Outcome] | None:
        token = self.transport.send(command)
        outcomes = self._gather(token, time.monotonic(), deadline, kinds, None)
        self.transport.done(token, outcomes)
        return outcomes if all(o.ok for o in outcomes) else None

    def kill(self, token: int | None = None) -> None:
        """End the current generation (local ranks are killed with everything they started;
        torchrun's leave ``token``); the next job starts a new one."""
        self.lost = self.lost or self.transport.recover(token, [])
        self.started = False

    def stop(self, timeout: float = 3.0) -> None:
        """Ask the ranks to leave the process group and exit; end those that do not."""
        self.transport.close(timeout)
        self.started = False
