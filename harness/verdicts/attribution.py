"""Which clause a failure breaks: :func:`clause` tags what its body raises.

[Note: clause isolation] A check exists to test its own clauses, but to reach its property it
calls other parts of the strategy too: it builds the strategy and the model, saves a
checkpoint in order to test loading, tears the strategy down at the end. A failure in those
calls is a violation of *their* clause, not of the check's. So the suites wrap them::

    with clause("API-2"):
        model = strategy.setup_module(model)
    ...                                   # the check's own property
    with clause("API-8", after=True):
        strategy.teardown()

An exception escaping ``with clause(ID)`` carries ``ID`` (the innermost ``clause`` wins; an
``Unsupported`` is never tagged: it is a refusal, not a violation). The conformance plugin
reads it: a check whose failure carries one of its own clauses fails under that clause only; a
failure carrying another clause makes the check ``blocked`` by that clause (its property was
never reached). With ``after=True`` (on a rank) the exception is *not* raised: the property
was already tested, so the check's verdict stands, and the violation travels back with the
job's result and is reported once, as a finding of its own clause.

Works the same on the ranks (the worker ships the tag with the error) and in the controller
(an assertion made under ``with clause(...)``).

[Note: looking through] Some checks can only see their own result through another clause's
method: the training session sees what a checkpoint holds by loading it. When such a look
fails, the check cannot tell its own bug from a bug of the method it looked through. The
suites wrap those looks in the controller::

    with looking("CKPT-RT-1", "CKPT-RT-2"):
        compare(run(load_and_read_rank, ...), expected)

An exception escaping ``looking`` carries those clauses. If it breaks one of the check's own
clauses (tagged with one inside, named by its message, or untagged) and the session already
holds a finding under one of the looked-through clauses, the check is ``blocked`` by that
finding (the method it looks through is known to be broken); otherwise the failure is what
it would be without ``looking`` (another clause's tag still blocks the check by that
clause). Where a check can decide by itself whose method broke (the files on disk did not
change, so a wrong load is the load's), it raises under ``clause`` instead.

[Note: the clause of a failure met in a method] Which clause an exception raised inside a
strategy method breaks, the first rule that applies:

1. The innermost ``clause(...)`` block open when the exception passed it, on the rank or in
   the controller around the job, names it (:func:`tag`), whatever the method: the suite
   that wrapped the call knows what the call exercises better than the method's name does
   (``with clause("CKPT-BUF-1"): strategy.load_checkpoint(...)`` files a failed load under
   CKPT-BUF-1, not the round trip). The tag is set while the exception passes the block, so
   the rules below only ever see a failure met with no block open. A block's clause wins
   even when it is not one the method can break: the suite said what its call is for. (A
   ``looking`` block is no such block: it says which findings may explain the failure.)
   One exception: a training step in a job that loaded a checkpoint, tagged by its own
   block, is the round trip's the check declares while no finding explains it (the step
   ran on what the load left; :meth:`harness.conformance.findings.grouping.Findings.settle`).
2. Untagged: the method's most telling clause the check declares (:func:`method_clause`:
   ``load_checkpoint`` in a round trip is the round trip's, CKPT-RT-1).
3. A checkpoint method the check declares none of those for: the check's first checkpoint
   clause the method can break (a failed ``load_checkpoint`` of the trainer layout check is
   CKPT-TRAINER-1's, never CKPT-REKEY-2's, which is about what torch's own loader reads).
4. Else the method's own first clause: the check is blocked by it.

What no rule can tell: a load that rightly refuses what its own save wrote (a strict load
meeting a non-persistent buffer the save should not have written, CKPT-BUF-1) raises inside
``load_checkpoint`` like a broken load, and is filed under the round trip. Only a suite that
looks at the file under the save's clause before it loads (rule 1) files it under that
clause.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from harness.contract import Unsupported

__all__ = [
    "ROUND_TRIP_CLAUSES",
    "TRAINING_METHODS",
    "LateViolation",
    "clause",
    "clause_of",
    "last_looked_failure",
    "looked_through",
    "looking",
    "method_clause",
    "tag",
    "take_late_violations",
]

_ATTRIBUTE = "shardcheck_clause"
_THROUGH = "shardcheck_through"
# A rank's buffer, not session state: the violations after the property in the job this
# process is running, emptied when the runner ships the job's answer.
_LATE: list[LateViolation] = []
# The controller's note of the last failure that escaped ``looking`` in the running check: a
# state machine's search is ended by it once a known finding explains it (see
# :meth:`harness.conformance.outcomes.economy.ShrinkPolicy.before_job`).
_LOOKED: list[BaseException] = []


@dataclass(frozen=True)
class LateViolation:
    """An exception raised under ``clause(ID, after=True)``: reported, not raised.

    Args:
        clause: the clause it violates.
        type_name: qualified name of the exception class.
        message: ``str(exc)``.
        traceback: the formatted traceback.
    """

    clause: str
    type_name: str
    message: str
    traceback: str


def tag(exc: BaseException, clause_id: str) -> None:
    """Attribute ``exc`` to ``clause_id`` unless an inner ``clause`` already did."""
    if not clause_id or isinstance(exc, Unsupported) or clause_of(exc):
        return
    try:
        setattr(exc, _ATTRIBUTE, clause_id)
    except AttributeError:  # an exception type with __slots__: cannot carry the tag
        pass


def clause_of(exc: BaseException) -> str:
    """The clause ``exc`` was attributed to, or ``""``."""
    value = getattr(exc, _ATTRIBUTE, "")
    return value if isinstance(value, str) else ""


@contextmanager
def clause(clause_id: str, *, after: bool = False) -> Iterator[None]:
    """Attribute an exception raised in the body to ``clause_id``.

    Args:
        clause_id: the contract's clause id the body exercises (e.g. ``"API-8"``).
        after: the check's property was already tested: record the exception as a late
            violation of ``clause_id`` (see :func:`take_late_violations`) instead of raising.

    Raises:
        ValueError: ``clause_id`` is empty.
    """
    if not isinstance(clause_id, str) or not clause_id.strip():
        raise ValueError(
            f"clause({clause_id!r}) needs a clause id such as 'API-8'; "
            "see CONTRACT.md or pytest --list-clauses."
        )
    try:
        yield
    except Exception as exc:
        if isinstance(exc, Unsupported):
            raise
        tag(exc, clause_id)
        if not after:
            raise
        cls = type(exc)
        _LATE.append(
            LateViolation(
                clause=clause_of(exc) or clause_id,
                type_name=cls.__qualname__
                if cls.__module__ == "builtins"
                else f"{cls.__module__}.{cls.__qualname__}",
                message=str(exc),
                traceback="".join(traceback.format_exception(exc)),
            )
        )


@contextmanager
def looking(*clause_ids: str) -> Iterator[None]:
    """The body looks at the check's result through the methods of ``clause_ids``
    (see [Note: looking through]): an exception escaping it carries them.

    Raises:
        ValueError: no clause id, or an empty one.
    """
    if not clause_ids or not all(isinstance(c, str) and c.strip() for c in clause_ids):
        raise ValueError(
            f"looking{clause_ids!r} needs the clause ids of the methods looked through, such "
            "as looking('CKPT-RT-1'); see CONTRACT.md or pytest --list-clauses."
        )
    try:
        yield
    except Exception as exc:
        if not isinstance(exc, Unsupported) and not looked_through(exc):
            try:
                setattr(exc, _THROUGH, tuple(clause_ids))
            except AttributeError:  # an exception type with __slots__: cannot carry it
                pass
            else:
                _LOOKED[:] = [exc]
        raise


def last_looked_failure(*, clear: bool = False) -> BaseException | None:
    """The last exception that escaped ``looking`` (in this process), or None; ``clear``:
    forget it (a new check starts)."""
    found = _LOOKED[-1] if _LOOKED else None
    if clear:
        _LOOKED.clear()
    return found


def looked_through(exc: BaseException) -> tuple[str, ...]:
    """The clauses whose methods ``exc`` was raised looking through, or ``()``."""
    value = getattr(exc, _THROUGH, ())
    return value if isinstance(value, tuple) else ()


#: every round-trip clause: a failure in a training step of a job that loaded a checkpoint
#: looks through them (the step ran on what the load left)
ROUND_TRIP_CLAUSES = ("CKPT-RT-1", "CKPT-RT-2", "CKPT-RT-3", "CKPT-RT-4", "CKPT-RT-5", "CKPT-RT-6")
_CHECKPOINT = (
    *ROUND_TRIP_CLAUSES,
    "CKPT-SAVE-6",
    "CKPT-SAVE-7",
    "CKPT-LOAD-1",
    "CKPT-LOAD-2",
    "CKPT-TRAINER-1",
)
#: the strategy methods that train (run a step on the objects a check holds)
TRAINING_METHODS = frozenset({"backward", "optimizer_step", "clip_gradients_norm", "forward"})
#: a strategy method -> the clauses that say what it does, most telling first
_METHOD_CLAUSES: dict[str, tuple[str, ...]] = {
    "save_checkpoint": _CHECKPOINT,
    "load_checkpoint": _CHECKPOINT,
    "setup_environment": ("API-1", "MP-1"),
    "module_init_context": ("API-3", "INIT-1"),
    "setup_module": ("API-2",),
    "setup_optimizer": ("API-2",),
    "setup_module_and_optimizers": ("API-2",),
    "backward": ("API-4", "TRAIN-1"),
    "optimizer_step": ("API-4", "TRAIN-1"),
    "forward": ("API-4", "TRAIN-1"),
    "clip_gradients_norm": ("CLIP-1",),
    "no_backward_sync": ("SYNC-1", "MP-4"),
    "all_reduce": ("API-5",),
    "broadcast": ("API-5",),
    "barrier": ("API-5",),
    "teardown": ("API-8",),
}


#: checkpoint clauses a strategy method cannot break: what torch's own ``load_state_dict``
#: reads from the file the strategy saved (CKPT-REKEY-2) is the save's, never the load's
_NOT_BROKEN_BY: dict[str, frozenset[str]] = {
    "load_checkpoint": frozenset({"CKPT-REKEY-2"}),
}


def method_clause(method: str, check_clauses: list[str]) -> str:
    """The clause an untagged exception raised inside the strategy's ``method`` breaks, for
    a check declaring ``check_clauses`` ([Note: the clause of a failure met in a method]):
    the method's most telling clause the check declares (a checkpoint method: else the
    check's first ``CKPT-*`` clause the method can break), else the method's own first
    clause (the check is then blocked by it); ``""`` for a method the contract does not
    name."""
    known = _METHOD_CLAUSES.get(method, ())
    declared = [c for c in known if c in check_clauses]
    if declared:
        return declared[0]
    if known is _CHECKPOINT:
        cannot = _NOT_BROKEN_BY.get(method, frozenset())
        breakable = (c for c in check_clauses if c.startswith("CKPT-") and c not in cannot)
        return next(breakable, known[0])
    return known[0] if known else ""


def take_late_violations() -> tuple[LateViolation, ...]:
    """The late violations recorded since the last call (the worker ships them per job)."""
    taken = tuple(_LATE)
    _LATE.clear()
    return taken
