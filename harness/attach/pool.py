"""The controller's side of attach mode: the torchrun ranks seen as a pool of one world size.

:class:`AttachedPool` offers what :class:`harness.pool.RankPool` offers (``start``, ``run``,
``stop``, ``kill``) over torchrun's store instead of pipes. It cannot start or kill processes:

- a rank that raised is healed as in the local pool (health check; a new process-group
  generation when the ranks disagree or a collective failed);
- a rank that hung gets its stacks dumped by its watchdog, the job is aborted on every rank
  (``SIGUSR2``), and the ranks form a new process group;
- a rank that stops its heartbeat (crashed, killed, node lost) cannot be replaced inside a
  torchrun run: the pool is *lost*, the job's outcome says so, and every later job raises
  :class:`AttachLost` at once (the plugin then ends the session, so the report is written).
"""

from __future__ import annotations

import os
import pickle
import time
from datetime import timedelta

import torch.distributed as dist

from harness.attach.session import START, AttachInfo, AttachStart, connect, key
from harness.fnref import rewritten_modules
from harness.outcomes import (
    Outcome,
    format_story,
    outcome_from_error,
    outcome_from_result,
    tidy_stacks,
)
from harness.pool import PoolSettings, PoolStartError
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
    Event,
    Job,
)
from harness.worker import pg_timeout_for

__all__ = ["AttachLost", "AttachedPool"]

RANK_ENV_PREFIXES = ("SHARDCHECK_RANK_",)  # controller settings the ranks must see
WAIT_SLICE = 0.25  # longest wait for replies before looking at failures and heartbeats
STORE_ERRORS = (dist.DistError, ConnectionError)


_Dump = tuple[str, str, str]  # a rank's (stacks, stdout, stderr)


class AttachLost(RuntimeError):
    """A rank of the torchrun run is gone: attach mode cannot go on (the message says which)."""


class AttachedPool:
    """The ranks of a torchrun run, driven through its store.

    Args:
        info: where the store is and how many ranks there are.
        settings: as for the local pool (``world_size`` must be torchrun's).
        lost_after: seconds without a heartbeat after which a rank counts as gone.
        abort_grace: seconds the ranks get to come back after a job is aborted.
    """

    def __init__(
        self,
        info: AttachInfo,
        settings: PoolSettings,
        lost_after: float = 10.0,
        abort_grace: float = 15.0,
    ) -> None:
        if settings.world_size != info.world_size:
            raise ValueError(
                f"attach mode runs torchrun's world size {info.world_size}, "
                f"not {settings.world_size}."
            )
        self.info = info
        self.settings = settings
        self.lost_after = lost_after
        self.abort_grace = abort_grace
        self.store = connect(info)
        self.seq = 0
        self.generation = 0
        self.started = False
        self.lost: str | None = None
        self.stopped = False
        self.respawns = 0
        self._beats: dict[int, tuple[int, float]] = {}

    @property
    def world_size(self) -> int:
        """torchrun's world size."""
        return self.info.world_size

    def _check_usable(self) -> None:
        if self.lost is not None:
            raise AttachLost(self.lost)
        if self.stopped:
            raise AttachLost("attach mode: the ranks were already told to stop")

    def start(self) -> float:
        """Form a process group of a new generation on every rank; return the seconds taken.

        Raises:
            PoolStartError: a rank could not join (the pool is then lost).
        """
        self._check_usable()
        began = time.monotonic()
        self.generation += 1
        environ = {k: v for k, v in os.environ.items() if k.startswith(RANK_ENV_PREFIXES)}
        payload = AttachStart(
            generation=self.generation,
            backend=self.settings.backend,
            pg_timeout=self.settings.pg_timeout,
            threads=self.settings.threads,
            rewrite=rewritten_modules(),
            warm_up=self.settings.warm_up and self.generation == 1,
            environ=environ,
        )
        seq = self._send(Command(START, 0, payload))
        outcomes = self._gather(seq, began, began + self.settings.start_timeout, (READY,), None)
        if not all(o.ok for o in outcomes):
            what = f"forming process group {self.generation} of {self.world_size} torchrun ranks"
            self.lost = format_story(outcomes, f"{what} failed")
            raise PoolStartError(self.lost)
        self.started = True
        if self.generation > 1:
            self.respawns += 1
        return time.monotonic() - began

    def run(self, job: Job, job_id: int, what: str) -> list[Outcome]:
        """Run one job on every rank and return the outcomes (healing what can be healed).

        Raises:
            AttachLost: the pool was lost before this job.
        """
        self._check_usable()
        try:
            if not self.started:
                self.start()
            began = time.monotonic()
            seq = self._send(Command(JOB, job_id, job))
            try:
                outcomes = self._gather(
                    seq, began, began + job.timeout, (RESULT, ERROR), self.settings.failure_grace
                )
            except STORE_ERRORS:
                raise
            except BaseException:
                self._abort(seq, [])  # interrupted: let the ranks leave the job, then re-form
                self.started = False
                raise
            self._heal(seq, outcomes, job_id)
        except STORE_ERRORS as exc:
            self.lost = (
                f"lost contact with torchrun's store at {self.info.host}:{self.info.port} "
                f"({type(exc).__name__}: {exc}): the torchrun agent has exited (a rank died and "
                "torchrun stopped the run, or torchrun was interrupted)"
            )
            raise AttachLost(self.lost) from None
        return outcomes

    def _send(self, command: Command) -> int:
        self.seq += 1
        self.store.set(key("cmd", self.seq), pickle.dumps(command))
        return self.seq

    def _gather(
        self,
        seq: int,
        began: float,
        deadline: float,
        kinds: tuple[str, ...],
        grace: float | None,
    ) -> list[Outcome]:
        n = self.world_size
        outcomes: list[Outcome | None] = [None] * n
        cutoff, why = deadline, f"still running at the deadline ({deadline - began:.1f} s)"
        next_beat_check = time.monotonic() + 0.5
        while None in outcomes and time.monotonic() < cutoff:
            pending = [r for r in range(n) if outcomes[r] is None]
            if self._all_arrived([key("reply", seq, r) for r in pending], cutoff):
                ready = pending
            else:
                ready = [r for r in pending if self.store.check([key("reply", seq, r)])]
            for rank, outcome in zip(ready, self._receive(seq, ready, kinds, began), strict=True):
                outcomes[rank] = outcome
                if not outcome.ok and grace is not None and cutoff == deadline:
                    cutoff = min(deadline, time.monotonic() + grace)
                    if cutoff < deadline:
                        why = (
                            f"still running {grace:.1f} s after rank {rank} {outcome.kind} "
                            "(the job had already failed)"
                        )
            if ready:
                continue
            if time.monotonic() >= next_beat_check:
                next_beat_check = time.monotonic() + 0.5
                silent = self._silent(pending)
                for rank, seconds in silent.items():
                    outcomes[rank] = Outcome(
                        rank,
                        "crashed",
                        detail=(
                            f"no heartbeat for {seconds:.0f} s: the process died or its node is "
                            "unreachable (torchrun cannot replace a rank inside a run)"
                        ),
                        elapsed=time.monotonic() - began,
                    )
                if silent and grace is not None and cutoff == deadline:
                    cutoff = min(deadline, time.monotonic() + grace)
                    why = f"still running {grace:.1f} s after rank {min(silent)} went silent"
        elapsed = time.monotonic() - began
        hung = [r for r in range(n) if outcomes[r] is None]
        if not hung:
            self.store.delete_key(key("cmd", seq))  # every rank has answered it
        if hung:
            dumps = self._stacks(seq, hung)
            for rank in hung:
                stacks, stdout, stderr = dumps.get(rank, ("", "", ""))
                outcomes[rank] = Outcome(
                    rank,
                    "hung",
                    detail=why,
                    elapsed=elapsed,
                    stacks=tidy_stacks(stacks) or "(no stack dump arrived)",
                    stdout=stdout,
                    stderr=stderr,
                )
        return [o for o in outcomes if o is not None]

    def _all_arrived(self, keys: list[str], cutoff: float) -> bool:
        """Wait (``WAIT_SLICE`` at most, not past ``cutoff``) until every key is set."""
        limit = max(0.001, min(WAIT_SLICE, cutoff - time.monotonic()))
        try:  # the store answers as soon as the keys are set; a timed-out wait is harmless
            self.store.wait(keys, timedelta(seconds=limit))
        except dist.DistStoreError:
            return False
        return True

    def _receive(
        self, seq: int, ranks: list[int], kinds: tuple[str, ...], began: float
    ) -> list[Outcome]:
        """The outcomes of ``ranks``, whose replies to ``seq`` have arrived (then dropped)."""
        if not ranks:
            return []
        keys = [key("reply", seq, rank) for rank in ranks]
        outcomes = []
        for data in self.store.multi_get(keys):
            event, stdout, stderr = pickle.loads(data)
            outcome = self._outcome(event, kinds, began)
            outcome.stdout, outcome.stderr = stdout, stderr
            outcomes.append(outcome)
        for reply_key in keys:
            self.store.delete_key(reply_key)
        return outcomes

    @staticmethod
    def _outcome(event: Event, kinds: tuple[str, ...], began: float) -> Outcome:
        elapsed = time.monotonic() - began
        if event.kind == ERROR:
            return outcome_from_error(event.rank, event.payload, elapsed)
        if event.kind == RESULT:
            return outcome_from_result(event.rank, event.payload, elapsed)
        if event.kind not in kinds:
            raise RuntimeError(f"rank {event.rank} answered {event.kind!r}, expected {kinds}")
        return Outcome(event.rank, "ok", value=event.payload, elapsed=elapsed)

    def _silent(self, ranks: list[int]) -> dict[int, float]:
        """The ranks among ``ranks`` whose heartbeat stopped, with the seconds of silence."""
        now, silent = time.monotonic(), {}
        for rank in ranks:
            count = int(self.store.add(key("beat", rank), 0))
            last = self._beats.get(rank)
            if last is None or last[0] != count:
                self._beats[rank] = (count, now)
            elif now - last[1] > self.lost_after:
                silent[rank] = now - last[1]
        return silent

    def _stacks(self, seq: int, ranks: list[int], settle: float = 3.0) -> dict[int, _Dump]:
        """Ask the ranks still in ``seq`` for their stacks; wait ``settle`` s at most."""
        self.store.set(key("dump", seq), "1")
        found: dict[int, _Dump] = {}
        deadline = time.monotonic() + settle
        while len(found) < len(ranks) and time.monotonic() < deadline:
            for rank in ranks:
                stacks_key = key("stacks", seq, rank)
                if rank not in found and self.store.check([stacks_key]):
                    found[rank] = pickle.loads(self.store.get(stacks_key))
            time.sleep(0.05)
        return found

    def _abort(self, seq: int, late: list[int]) -> list[int]:
        """Abort ``seq`` on every rank; wait for the ``late`` ranks' replies.

        Returns the ranks that did not come back within ``abort_grace`` seconds.
        """
        self.store.set(key("abort", seq), "1")
        deadline = time.monotonic() + self.abort_grace
        waiting = list(late)
        while waiting and time.monotonic() < deadline:
            waiting = [r for r in waiting if not self.store.check([key("reply", seq, r)])]
            time.sleep(0.05)
        return waiting

    def _heal(self, seq: int, outcomes: list[Outcome], job_id: int) -> None:
        kinds = {o.kind for o in outcomes}
        if "crashed" in kinds:
            self.store.set(key("abort", seq), "1")  # the ranks still alive leave the job
            silent = [o.rank for o in outcomes if o.kind == "crashed"]
            self.lost = (
                f"rank(s) {silent} went silent during job {job_id}; torchrun cannot replace a "
                "rank inside a run, so the run ends here"
            )
            return
        if "hung" in kinds:
            hung = [o.rank for o in outcomes if o.kind == "hung"]
            stuck = self._abort(seq, hung)
            if stuck:
                self.lost = (
                    f"rank(s) {stuck} did not leave job {job_id} within {self.abort_grace:.0f} s "
                    "of being aborted; attach mode cannot kill or replace a torchrun rank, so "
                    "the run ends here."
                )
                return
            self._restart()
            return
        if "raised" not in kinds:
            return
        if any(o.error and o.error.is_distributed for o in outcomes) or not self.healthy(job_id):
            self._restart()

    def _restart(self) -> None:
        self.started = False
        try:
            self.start()
        except PoolStartError:
            pass  # self.lost holds the story; the next job raises AttachLost

    def healthy(self, job_id: int) -> bool:
        """Whether every rank reports the same state and passes a short barrier."""
        began = time.monotonic()
        limit = self.settings.health_timeout
        seq = self._send(Command(STATE, job_id))
        states = self._gather(seq, began, began + limit / 2, (STATE,), None)
        if not all(s.ok for s in states) or any(s.value != states[0].value for s in states):
            return False
        seq = self._send(Command(BARRIER, job_id, pg_timeout_for(limit / 2)))
        return all(o.ok for o in self._gather(seq, began, began + limit, (HEALTHY,), None))

    def kill(self) -> None:
        """Attach mode cannot kill ranks: form a new process group before the next job."""
        self.started = False

    def stop(self, timeout: float = 3.0) -> None:
        """Tell every rank to leave (the torchrun workers then exit)."""
        if self.stopped:
            return
        self.stopped = True
        try:
            self._send(Command(STOP, 0))
        except (RuntimeError, OSError):
            pass  # the store is gone: the ranks are gone too
