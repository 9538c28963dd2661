"""Failures named as what they are: a desync, a lonely collective, or the generic story.

:func:`failure_for` turns the outcomes of a failed job into the exception
``run_on_ranks`` raises. Each kind is its own :class:`~harness.verdicts.outcomes.RankFailure`
subclass raised from one place, so a replay of the same bug fails the same way (Hypothesis compares
the exception type and where it was raised: another type would read as a flaky test).

- :class:`CollectiveDesync`: ranks entered collectives that do not match (torch's collective
  checker raised on at least one rank); the message names each rank's collective (op,
  shapes, dtypes) and the innermost frame of the strategy's code that entered it.
- :class:`CollectiveHang`: some ranks finished the job while others still wait inside it
  (a lonely collective), or every rank outlived the deadline; the message names which ranks
  finished and the collective and strategy frame each waiting rank is in.

[Note: a hang among other failures] Ranks that fail in different ways, one of them hung, read
as a hang when every other failure follows from it: a rank that raised a distributed error
(its collective timed out, or its peer's connection closed, because the hung rank never came)
gave up waiting on the hung one. A rank that raised an error of its own (a ``ValueError`` in
the strategy) is the cause instead (its peers wait for it in a collective it left), and a
rank that crashed is named as the crash: both stay the plain :class:`RankFailure`, whose
story puts the first failure first.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.verdicts.outcomes import (
    BUDGET_DETAIL,
    STUCK_DETAIL,
    Outcome,
    RankFailure,
    format_story,
)

__all__ = ["CollectiveDesync", "CollectiveHang", "failure_for", "signature"]


class CollectiveDesync(RankFailure):
    """The ranks entered different collectives (or the same one with other tensors)."""

    kind = "desync"


class CollectiveHang(RankFailure):
    """Ranks waited inside the job: alone in a collective after others finished, or past
    the deadline."""

    kind = "hang"


def _desync_lines(outcomes: Sequence[Outcome]) -> list[str]:
    lines = ["desync: the ranks entered collectives that do not match"]
    for o in outcomes:
        if o.collective is not None and o.kind == "raised":
            lines.append(f"  rank {o.rank} entered {o.collective.describe()}")
        elif o.collective is not None:
            lines.append(f"  rank {o.rank} waits in {o.collective.describe()}")
        else:
            lines.append(f"  {o.headline()}")
    return lines


def _hang_lines(outcomes: Sequence[Outcome]) -> list[str]:
    finished = [o.rank for o in outcomes if o.ok]
    gave_up = [o for o in outcomes if o.kind == "raised"]
    hung = [o for o in outcomes if o.kind == "hung"]
    if finished:
        ranks = ", ".join(map(str, finished))
        head = f"hang: rank(s) {ranks} finished the job while the others still wait in it"
    elif gave_up:
        ranks = ", ".join(str(o.rank) for o in gave_up)
        head = f"hang: rank(s) {ranks} gave up waiting for the others, who still wait in the job"
    elif hung[0].detail.startswith((BUDGET_DETAIL, STUCK_DETAIL)):
        head = f"hang: every rank was {hung[0].detail}"
    else:
        head = "hang: every rank was still inside the job at its deadline"
    lines = [head]
    for o in hung:
        where = o.collective.describe() if o.collective else "no collective (see its stack)"
        lines.append(f"  rank {o.rank} waits in {where}")
    for o in gave_up:
        lines.append(f"  {o.headline()} (a collective that could not complete: see below)")
    return lines


def _is_hang(outcomes: Sequence[Outcome]) -> bool:
    """Some rank hung and every other failure follows from it (see [Note: a hang among
    other failures])."""
    return any(o.kind == "hung" for o in outcomes) and all(
        o.kind in ("ok", "hung") or (o.error is not None and o.error.is_distributed)
        for o in outcomes
    )


def signature(failure: RankFailure) -> str:
    """What identifies one bug across replays: the kind and each rank's collective op."""
    ops = [o.collective.op if o.collective else o.kind for o in failure.outcomes]
    return f"{type(failure).__name__}({', '.join(ops)})"


def failure_for(outcomes: Sequence[Outcome], what: str) -> RankFailure:
    """The exception for a failed job: a desync, a hang, or the plain :class:`RankFailure`."""
    story = format_story(outcomes, what)
    if any(o.kind == "raised" and o.collective is not None for o in outcomes):
        return CollectiveDesync("\n".join([*_desync_lines(outcomes), story]), outcomes)
    if _is_hang(outcomes):
        return CollectiveHang("\n".join([*_hang_lines(outcomes), story]), outcomes)
    return RankFailure(story, outcomes)
