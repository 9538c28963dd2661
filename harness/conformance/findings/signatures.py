"""Signatures: what one failing check's failure is, for grouping into findings.

A *signature* names a root cause: the clause the failure is attributed to, the exception's
type, its message with numbers, shapes, device meshes, paths and addresses masked
(:mod:`harness.conformance.findings.masking`), and the innermost frame outside shardcheck (the
strategy's or torch's code where it was raised: :mod:`harness.conformance.findings.tracebacks`).
For an assertion made by a suite (its innermost frame is shardcheck's own) the location is
left out: the clause and the assertion's words name it. The message shown is told what is wrong
first (:mod:`harness.conformance.findings.headlines`). :mod:`harness.conformance.findings.grouping`
groups failures by it.

[Note: clause isolation] (in :mod:`harness.verdicts.attribution`) says how a failure gets its
clause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from harness.conformance.findings.checked_headline import told_after_right_file
from harness.conformance.findings.crash_site import OWN_DIRS, clause_at_crash, crashed_inside
from harness.conformance.findings.headlines import (
    assertion_key,
    headline,
    named_clause,
    no_message,
    told,
)
from harness.conformance.findings.masking import difference, first_line_of, mask
from harness.conformance.findings.tracebacks import (
    FRAME,
    caller_of_torch,
    collective_site,
    is_own,
    tb_text,
    where_in_text,
)
from harness.hypothesis_compat import is_wrapped_base_exception
from harness.verdicts.attribution import (
    ROUND_TRIP_CLAUSES,
    TRAINING_METHODS,
    LateViolation,
    clause_of,
    looked_through,
)
from harness.verdicts.checked_file import checked_file_of
from harness.verdicts.outcomes import RankFailure

__all__ = [
    "Attribution",
    "attribute",
    "distinct_failures",
    "is_failure",
    "late_attribution",
]

#: the first line of a suite's report of a rank's exception: ``rank 0: ValueError: ...``
_RANK_ERROR = re.compile(
    r"^rank \d+: ((?:[\w]+\.)*[A-Z]\w*(?:Error|Exception|Warning)?): (.*)$", re.M
)


@dataclass(frozen=True)
class Attribution:
    """What one failing check's failure is, for grouping and reporting.

    Args:
        clause: the clause the failure was attributed to (``harness.clause``), or ``""``.
        kind: ``raised``, ``crashed`` or ``hung`` (a rank's outcome), or ``assertion`` (a
            suite's comparison failed in the controller).
        type_name: the exception type.
        key: the masked message.
        where: ``file:line function`` of the innermost frame outside shardcheck, or of the
            assertion.
        message: the unmasked first line (for the report).
        through: the clauses whose methods the failing code looked through
            (``harness.looking``; [Note: looking through]).
        difference: for a suite's assertion that a nested value differs, that difference
            alone (``optimizer['state'][…]: N of N elements differ from what was saved``):
            the same wrong value whichever check, family, format or rank met it.
        method: the strategy method a suite called that the exception came out of
            (``load_checkpoint``), or ``""``: an untagged failure is that method's clause's
            (:func:`harness.verdicts.attribution.method_clause`).
        raised_in: for an exception raised in torch's code (a desync caught in c10d, a shape
            error in an op) called from the strategy's, torch's innermost frame; ``where``
            is then the strategy's own line that called into torch. ``""`` otherwise.
    """

    clause: str
    kind: str
    type_name: str
    key: str
    where: str
    message: str
    through: tuple[str, ...] = ()
    difference: str = ""
    method: str = ""
    raised_in: str = ""

    @property
    def place(self) -> str:
        """Type, masked message and location, without the clause: the same error raised at
        the same place in the strategy (not for a suite's assertion, whose words are all)."""
        if self.kind == "assertion":
            return ""
        return f"{self.type_name}: {self.key} @ {_strip_line(self.where)}"

    def signature(self, clauses: list[str]) -> str:
        """The grouping key, for a failure of a check declaring ``clauses``."""
        named = self.clause or ",".join(clauses)
        place = "" if self.kind == "assertion" else f" @ {_strip_line(self.where)}"
        return f"{named}: {self.type_name}: {self.difference or self.key}{place}"

    @property
    def same_difference(self) -> str:
        """The key of a suite's report of a wrong nested value, without the clause: one wrong
        value met by checks of several clauses (a load that drops the optimizer state fails
        every round trip alike), or ``""``."""
        return f"{self.type_name}: {self.difference}" if self.difference else ""


def _strip_line(where: str) -> str:
    # same function in the same file: the same place, even when a line moved
    file, _, rest = where.partition(":")
    return f"{file}:{rest.partition(' ')[2]}" if rest else where


def _strategy_site(attribution: Attribution, text: str) -> Attribution:
    """``attribution`` whose ``where`` is the strategy's line that called into torch when
    the exception was raised in torch's code, torch's frame kept as ``raised_in``."""
    caller, raised_in = caller_of_torch(text)
    if not caller:
        return attribution
    return replace(attribution, where=caller, raised_in=raised_in)


def _leaves(exc: BaseException, flaky: bool = False) -> list[tuple[BaseException, bool]]:
    """The exceptions an exception group holds, depth first (``[exc]`` for one exception),
    each with whether it came inside a flaky failure (a failure Hypothesis could not replay);
    an exception Hypothesis wrapped (a ``BaseException`` such as pytest-timeout's) unwrapped."""
    from hypothesis.errors import Flaky

    flaky = flaky or isinstance(exc, Flaky)
    inner = getattr(exc, "exceptions", None)
    if isinstance(inner, tuple) and inner:
        subs = [sub for sub in inner if isinstance(sub, BaseException)]
        return [leaf for sub in subs for leaf in _leaves(sub, flaky)]
    if is_wrapped_base_exception(exc) and exc.__cause__ is not None:
        exc = exc.__cause__
    return [(exc, flaky)]


def _candidates(exc: BaseException) -> list[BaseException]:
    """Of Hypothesis' several distinct failures, those that are the strategy's (not one inside
    a flaky failure, whose example passed when replayed, nor a test timeout), in order; all of
    them when none is."""
    leaves = _leaves(exc)
    steady = [leaf for leaf, flaky in leaves if not flaky and not _is_timeout(leaf)]
    return steady or [leaf for leaf, _ in leaves]


def _is_timeout(exc: BaseException) -> bool:
    return "Timeout (>" in str(exc) and "pytest-timeout" in str(exc)


def _type_name(cls: type) -> str:
    name = cls.__qualname__
    return name if cls.__module__ == "builtins" else f"{cls.__module__}.{name}"


def is_failure(exc: BaseException) -> bool:
    """Whether a test's exception is a failure (not a skip, an xfail or an interruption)."""
    import pytest

    if isinstance(exc, (KeyboardInterrupt, SystemExit, pytest.skip.Exception)):
        return False
    return not isinstance(exc, pytest.xfail.Exception)


def attribute(exc: BaseException, own: Sequence[str] = ()) -> Attribution:
    """The attribution of the exception a check's test raised: the clause a ``clause``
    block gave it, else the one its assertion message starts with.

    Of several distinct failures (an exception group), the first that breaks one of the
    check's ``own`` clauses (or names none), else the first: a check that found a violation
    of its own property fails on it, even if another example was blocked on the way.
    """
    return distinct_failures(exc, own)[0][1]


def distinct_failures(
    exc: BaseException, own: Sequence[str] = ()
) -> list[tuple[BaseException, Attribution]]:
    """Each failure a test's exception holds (one, or Hypothesis' several distinct failures)
    with its attribution, the one :func:`attribute` picks first, the others in Hypothesis'
    order."""
    pairs = [(leaf, _attribute_one(leaf)) for leaf in _candidates(exc)]
    first = next((i for i, (_, a) in enumerate(pairs) if not a.clause or a.clause in own), 0)
    return [pairs[first], *pairs[:first], *pairs[first + 1 :]]


def _attribute_one(exc: BaseException) -> Attribution:
    attribution = _attribute_plain(exc)
    # a suite's look through the round trip, and a training step after a load: both
    through = tuple(dict.fromkeys(looked_through(exc) + attribution.through))
    found = difference(attribution.message) if attribution.kind == "assertion" else ""
    return replace(
        attribution, through=through, difference=found, message=headline(attribution.message)
    )


#: a suite's rank job that loads a checkpoint (its module or function name says so: a load,
#: a round trip, a resume, a reshard): what trains in it may train on what a load left
_LOADING_JOB = re.compile(r"load|round_trip|resume|reshard")
#: a suite function that saves: a step under it trains what is about to be saved (or was
#: just saved), not what a load left (the round trip's save half, ``_round_trip_save``)
_SAVING = re.compile(r"save")


def _with_method(attribution: Attribution, traceback_text: str) -> Attribution:
    """``attribution`` with the strategy method the exception came out of; a training step
    in a job that loaded a checkpoint looks through the round trip ([Note: looking
    through]): a known load finding explains it."""
    if attribution.kind != "raised":
        return attribution
    frames = [(m["file"], m["func"]) for m in FRAME.finditer(traceback_text)]
    suite = [i for i, (file, _) in enumerate(frames) if file.startswith(OWN_DIRS[-1])]
    if not suite:
        return attribution
    called = [func for file, func in frames[suite[-1] + 1 :] if not is_own(file)]
    method = called[0] if called else ""
    loads = any(_LOADING_JOB.search(f"{Path(frames[i][0]).name}:{frames[i][1]}") for i in suite)
    loads = loads and not any(_SAVING.search(frames[i][1]) for i in suite)
    through = ROUND_TRIP_CLAUSES if method in TRAINING_METHODS and loads else ()
    return replace(attribution, method=method, through=through or attribution.through)


def _attribute_plain(exc: BaseException) -> Attribution:
    clause = clause_of(exc)
    found = checked_file_of(exc)  # the load met a file found right ([Note: a load after ...])
    if isinstance(exc, RankFailure):
        return _rank_attribution(exc, clause, found)
    where, outside = where_in_text(tb_text(exc.__traceback__))
    kind = "raised" if outside else "assertion"
    message = str(exc)
    clause = clause or named_clause(message)
    quoted = _RANK_ERROR.match(message)
    if quoted and not outside:
        # a suite's report of a rank's exception, with its traceback in the message (the API
        # probes): the rank's exception and where it was raised, as if it had come back raised
        in_text, outside_text = where_in_text(message)
        if outside_text:
            type_name, text = quoted.group(1), quoted.group(2)
            return Attribution(clause, "raised", type_name, mask(text), in_text, text.strip())
    type_name = _type_name(type(exc))
    text = tb_text(exc.__traceback__)
    first = first_line_of(message) or no_message(type_name, text, where)
    key = assertion_key(message) if kind == "assertion" else mask(message)
    attribution = Attribution(clause, kind, type_name, key, where, first)
    attribution = _with_method(_strategy_site(attribution, text), text)
    attribution = replace(attribution, message=told(attribution, first_line_of(message), text))
    return replace(
        attribution, message=told_after_right_file(attribution, found, first_line_of(message))
    )


def _rank_attribution(failure: RankFailure, clause: str, found: str = "") -> Attribution:
    if getattr(failure, "kind", "") == "hang":  # other ranks' errors follow from the hang
        return _hung_attribution(failure, clause)
    by_rank = {o.rank: o for o in failure.outcomes}
    first = by_rank[failure.failed_ranks[0]] if failure.failed_ranks else failure.outcomes[0]
    errors = [by_rank[r].error for r in failure.failed_ranks if by_rank[r].error is not None]
    own = [e for e in errors if e is not None and not e.is_distributed]
    error = own[0] if own else (first.error if first.error is not None else None)
    if error is not None:
        where, outside = where_in_text(error.traceback)
        if not outside and getattr(failure, "kind", "") == "desync":  # the strategy entered it
            where, outside = collective_site(str(failure)) or (where, outside)
        clause = clause or named_clause(error.message)
        kind = "raised" if outside else "assertion"
        line = first_line_of(error.message) or no_message(error.type_name, error.traceback, where)
        attribution = Attribution(clause, kind, error.type_name, mask(error.message), where, line)
        attribution = _with_method(_strategy_site(attribution, error.traceback), error.traceback)
        attribution = replace(
            attribution, message=told(attribution, first_line_of(error.message), error.traceback)
        )
        said = told_after_right_file(attribution, found, first_line_of(error.message))
        return replace(attribution, message=said)
    if first.kind == "crashed":
        what = f"exit code {first.exitcode}"
        clause = clause or clause_at_crash(first.stacks)
        through = crashed_inside(first.stacks)
        message = f"rank crashed: {what}"
        return Attribution(clause, "crashed", "crash", mask(what), "", message, through=through)
    return _hung_attribution(failure, clause)


def _hung_attribution(failure: RankFailure, clause: str) -> Attribution:
    """A hang told by its first hung rank: where its stack is, why it was cut off (a
    distributed error on another rank only gave up waiting for it: [Note: a hang among
    other failures] in :mod:`harness.verdicts.failures`)."""
    by_rank = {o.rank: o for o in failure.outcomes}
    hung = [by_rank[r] for r in failure.failed_ranks if by_rank[r].kind == "hung"]
    first = hung[0] if hung else failure.outcomes[0]  # first failure first
    where, _ = where_in_text(first.stacks)
    detail = first.detail or "the rank did not answer before its deadline"
    return Attribution(clause, "hung", "hang", mask(detail), where, detail)


def late_attribution(violation: LateViolation) -> Attribution:
    """The attribution of a violation recorded after a check's property (``after=True``)."""
    where, _ = where_in_text(violation.traceback)
    return Attribution(
        violation.clause,
        "raised",
        violation.type_name,
        mask(violation.message),
        where,
        first_line_of(violation.message),
    )
