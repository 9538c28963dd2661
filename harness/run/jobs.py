"""One job on the ranks of a session: arguments checked, dispatched, replayed, judged.

:func:`run_on_ranks` is what :func:`harness.api.run_on_ranks` does on the session in force:
it checks the arguments, pickles them into a :class:`~harness.wire.protocol.Job`, runs it on the
session's pool of that size, replays a job that hung or broke a collective with collective
checking (and runs the rest of its check checked), learns the check's deadlines, and returns
every rank's value or raises the failure that names every rank's story. Every job of a test
that pytest-timeout bounds ends before it does, with the harness's verdict (see [Note: the
test's time budget] in :mod:`harness.run.budget`).

Once a replay has named a desync, every later job of the session runs checked: the same bug
tends to meet the checks after it, and a checked job names a mismatch at once (well under a
second) where an unchecked one first waits out the hang, is killed and is replayed (about
two restarts of the ranks per check), and turning checking off again for the next check
would restart them once more.
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from harness.contract import Unsupported
from harness.entry import sigterm
from harness.pool.rankpool import PoolStartError, RankPool
from harness.refusals import EnvironmentRefusal
from harness.run.deadlines import current_check
from harness.run.session import HarnessSession
from harness.run.shrinking import shrink_once, stop_after_this_example
from harness.verdicts.failures import CollectiveDesync, CollectiveHang, failure_for
from harness.verdicts.outcomes import Outcome, RankFailure
from harness.wire.fnref import fn_ref_of
from harness.wire.protocol import FnRef, Job

__all__ = ["run_on_ranks"]


def run_on_ranks(
    session: HarnessSession,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    world_size: int,
    timeout: Any,
) -> list[Any]:
    """:func:`harness.api.run_on_ranks` on ``session`` (its docstring says the rest)."""
    __tracebackhide__ = True
    sigterm.raise_if_terminated()  # a SIGTERM swallowed since the last job stops the run here
    ref = fn_ref_of(fn)
    size = _check_world_size(session, world_size)
    check = current_check(str(ref))
    deadline = _check_timeout(session, timeout)
    if deadline is None:
        deadline = session.deadlines.deadline(check, str(ref))
    blob = _pickle_args(args)
    failure = _standing_verdict(session)  # the test's time is spent: not another job
    if failure is None:
        try:
            outcomes, what = _dispatch(session, ref, blob, deadline, size, check)
        except PoolStartError as exc:
            failure = _standing_verdict(session)  # a start the test's time cut off
            if failure is None:
                if session.budget is not None:
                    session.budget.verdict = exc  # the ranks could not start: the verdict
                raise
        else:
            if all(o.ok for o in outcomes):
                return [o.value for o in outcomes]
            failure = _standing_verdict(session) or _verdict(session, outcomes, what)
    raise failure


def _standing_verdict(session: HarnessSession) -> RankFailure | PoolStartError | None:
    """Once the test's time is spent, the failure it had before, raised again: a job (or a
    start of the ranks) that the spent budget cut off says nothing of its own, and Hypothesis'
    replay of a failing example must end as the example did (see [Note: the test's time
    budget] in :mod:`harness.run.budget`); ``None`` while time is left or nothing failed."""
    budget = session.budget
    if budget is None or budget.verdict is None or not budget.spent():
        return None
    stop_after_this_example()  # no new example: Hypothesis reports this one
    return budget.again()


def _dispatch(
    session: HarnessSession, ref: FnRef, blob: bytes, deadline: float, size: int, check: str
) -> tuple[list[Outcome], str]:
    """Run the job (replayed with collective checking when worth it) and learn from it;
    return the outcomes and what the job was (as a failure names it).

    Raises:
        TestTimeSpent: the test's time left no room for the job (see [Note: the test's time
            budget] in :mod:`harness.run.budget`).
        Unsupported: every rank refused the example.
    """
    __tracebackhide__ = True
    pool = session.pool_for(size)
    budget = session.budget
    if budget is not None and budget.spent():
        raise budget.not_sent(f"job {session.last_job_id + 1}: {ref} at world size {size}")
    if session.observer is not None:
        session.observer.before_job()  # the conformance plugin's shrink budget
    checked = _use_checking(session, pool, check)
    outcomes, what = _run_job(session, pool, ref, blob, deadline, size)
    if not checked and _worth_replaying(outcomes) and pool.can_check:
        session.checked_check = check  # the replay and the rest of this check run checked
        outcomes, what = _replay_checked(session, pool, (ref, blob, deadline, size), outcomes, what)
    session.deadlines.learn(check, str(ref), outcomes)
    if all(isinstance(o.exception, Unsupported) for o in outcomes):
        raise outcomes[0].exception  # type: ignore[misc]  # refused: no example ran
    session.job_ran()  # passed or failed, the example ran
    return outcomes, what


def _replay_checked(
    session: HarnessSession,
    pool: RankPool,
    job: tuple[FnRef, bytes, float, int],
    outcomes: list[Outcome],
    what: str,
) -> tuple[list[Outcome], str]:
    """Replay a job that hung or broke a collective with collective checking; return the
    outcomes to judge. Under a test's time budget the replay is cut off with the rest, and
    one that ran out of the test's time (or could not start the checked ranks in it) and
    named no desync tells less than the first run: that one's outcomes are kept."""
    budget = session.budget
    if budget is not None and budget.spent():
        return outcomes, f"{what} (not replayed with collective checking: the test's time is spent)"
    pool.set_checking(True)  # the ranks start again, checked
    try:
        replayed, again = _run_job(session, pool, *job)
    except PoolStartError:
        if budget is None or not budget.spent():
            raise
        return (
            outcomes,
            f"{what} (its replay with collective checking could not start the ranks before "
            "the test's time ran out)",
        )
    if budget is not None and budget.spent() and not _desync(replayed):
        return outcomes, f"{what} (its replay with collective checking ran out of the test's time)"
    return replayed, f"{again} (replayed with collective checking)"


def _desync(outcomes: Sequence[Outcome]) -> bool:
    """Whether a rank raised on a mismatch of collectives (``failure_for``'s desync)."""
    return any(o.kind == "raised" and o.collective is not None for o in outcomes)


def _verdict(session: HarnessSession, outcomes: list[Outcome], what: str) -> RankFailure:
    """The failure of a job that failed; Hypothesis' search and the test's time told of it."""
    failure = failure_for(outcomes, what)
    if isinstance(failure, CollectiveDesync):
        session.desync_seen = True
    if isinstance(failure, (CollectiveDesync, CollectiveHang)):
        shrink_once()  # one bug whatever the example's size: shrink it once
    budget = session.budget
    if budget is not None:
        budget.verdict = failure  # once the test's time is spent, later jobs raise it again
        if budget.spent():
            stop_after_this_example()  # no new example: Hypothesis replays this one
    return failure


def _check_world_size(session: HarnessSession, world_size: Any) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"run_on_ranks(world_size={world_size!r}): expected an int.")
    if world_size < 1:
        raise ValueError(f"run_on_ranks(world_size={world_size}): must be at least 1.")
    if world_size > session.config.max_world_size():
        # a check that needs more ranks than this session has is `environment`, never an
        # error: `--nproc 1` (the only NCCL world of a one-GPU machine) is a valid session,
        # and so is torchrun with fewer ranks than a check needs
        reason = session.unavailable_reason(world_size)
        assert reason is not None
        session.refuse(EnvironmentRefusal(reason))
    return world_size


def _check_timeout(session: HarnessSession, timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"run_on_ranks(timeout={timeout!r}): expected seconds as a number.")
    if not timeout > 0:
        raise ValueError(
            f"run_on_ranks(timeout={timeout}): must be a positive number of seconds "
            "(or None for a deadline learned from the check's passing jobs, at most "
            f"--rank-timeout={session.config.rank_timeout})."
        )
    return float(timeout)


def _run_job(
    session: HarnessSession, pool: RankPool, ref: FnRef, blob: bytes, deadline: float, size: int
) -> tuple[list[Outcome], str]:
    job_id = session.next_job_id()
    tmp_dir = os.path.join(session.session_root(), "jobs", f"job-{job_id}")
    config = session.config
    job = Job(ref, blob, deadline, tmp_dir, config.strategy, dict(config.strategy_options))
    what = f"job {job_id}: {ref} at world size {size}"
    bound = session.budget.bound() if session.budget is not None else None
    try:
        outcomes = pool.run(job, job_id, bound)
    finally:
        session.note_heals(pool, size)  # a failed start raises: its heal is kept too
        if os.path.isdir(tmp_dir):
            shutil.rmtree(tmp_dir, ignore_errors=True)
    session.publish(outcomes)
    return outcomes, what


def _use_checking(session: HarnessSession, pool: RankPool, check: str) -> bool:
    """Put the pool in the checking mode this check needs; return whether it checks."""
    wanted = session.config.check_collectives or session.desync_seen
    return pool.set_checking(wanted or check == session.checked_check)


def _pickle_args(args: tuple[Any, ...]) -> bytes:
    try:
        return pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"run_on_ranks: the arguments cannot be pickled for the ranks "
            f"({type(exc).__name__}: {exc}); pass plain data or module-level objects."
        ) from exc


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
