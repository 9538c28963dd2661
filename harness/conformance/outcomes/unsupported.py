"""Unsupported configurations: the skip outside Hypothesis, record-and-reject inside it.

[Note: unsupported configurations] A strategy refuses a configuration by raising
``harness.Unsupported`` (``run_on_ranks`` re-raises it in the controller when every rank
raised it). It takes the session's one refusal path (:mod:`harness.refusals`): outside
Hypothesis, the check becomes the skip ``unsupported: option=value (reason)``; inside a
Hypothesis test, the example is recorded on the running check (the session tells the check's
:class:`CheckWatch`) and rejected, so the other examples still run: the plugin wraps the
test's ``hypothesis.inner_test`` (the attribute Hypothesis lets plugins replace) for the
duration of the call. Only when no example could run does the check become that skip. When
some examples ran and passed (a check's explicit examples of a family the strategy offers) and
Hypothesis then ran out of draws because every later one was refused, the check passed on what
the strategy offers: it is ``passed``, with the refused values listed, not an error. Suites
may also call :func:`record_unsupported` and ``hypothesis.reject()`` themselves, or use
:func:`skip_or_reject_unsupported`; a ``reject()`` called while handling an ``Unsupported``
is recorded as well (the rejection's ``__context__`` is that ``Unsupported``), once: the
session's ``refuse`` raises its rejection *from* the refusal it recorded, so the wrapper
leaves that one alone (``tests/conformance/test_refusal_count.py`` counts the records).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from harness.conformance.findings.signatures import is_failure
from harness.conformance.outcomes.checks import Check
from harness.conformance.outcomes.economy import (
    CALL_REFUSALS_IN_A_ROW,
    REMEMBERED_IN_A_ROW,
    ShrinkPolicy,
)
from harness.contract import Unsupported, short_value, spec_field_names
from harness.hypothesis_compat import is_data_object, stop_test_type
from harness.refusals import Refusal, skip_exception
from harness.run.remembered import built_families, is_remembered
from harness.run.session import current
from harness.run.shrinking import stop_after_this_example
from harness.verdicts.attribution import last_looked_failure

__all__ = [
    "CheckWatch",
    "is_call_refusal",
    "note_job_ran",
    "record_unsupported",
    "refuses_its_family",
    "rejecting",
    "skip_exception",
    "skip_or_reject_unsupported",
]


@dataclass
class CheckWatch:
    """The running check's observer on the harness session
    (:class:`harness.run.session.CheckObserver`): counts the examples that ran, records refusals,
    and lets the shrink policy end a search before a job.

    Args:
        check: the running check.
        policy: the session's shrink policy (None: no budget).
    """

    check: Check
    policy: ShrinkPolicy | None = None

    def __post_init__(self) -> None:
        last_looked_failure(clear=True)  # a new check: an earlier one's look is not its own

    def before_job(self) -> None:
        """A job is about to be dispatched: the shrink budget may end the search here."""
        if self.policy is not None:
            self.policy.before_job(self.check)

    def job_ran(self) -> None:
        """A job of the check came back from the ranks: an example did run."""
        self.check.examples_ran += 1
        self.check.remembered_in_a_row = 0

    def refused(self, refusal: Refusal) -> None:
        """Record a strategy's refusal on the check (an environment refusal is not the
        strategy's answer: the plugin turns it into the ``environment`` skip)."""
        if isinstance(refusal, Unsupported):
            _refused(self.check, refusal)

    def exercised(self, axes: Mapping[str, Sequence[str]]) -> None:
        """Keep the axis values a job of the check ran (for the coverage table)."""
        entry = {name: tuple(values) for name, values in axes.items()}
        if entry not in self.check.exercised:
            self.check.exercised.append(entry)


def record_unsupported(exc: Unsupported) -> bool:
    """Record ``exc`` as an unsupported configuration of the check that is running.

    Args:
        exc: the ``Unsupported`` the strategy (or ``run_on_ranks``) raised.

    Returns:
        True if a check was running to record it on, False otherwise.

    Raises:
        TypeError: ``exc`` is not an ``Unsupported``.
        pytest.skip.Exception: the check gives up as unsupported (see :func:`_refused`).
    """
    if not isinstance(exc, Unsupported):
        raise TypeError(
            f"record_unsupported(exc={exc!r}) needs a harness.Unsupported, got "
            f"{type(exc).__name__}; catch Unsupported before recording it."
        )
    session = current()
    if session.observer is None:
        return False
    session.record_refusal(exc)
    return True


def _refused(check: Check, exc: Unsupported) -> None:
    """Record a refusal; give the check up as unsupported when no example ran and the last
    ones all met a refusal already known, or the same refusal (more draws would add nothing).

    Raises:
        pytest.skip.Exception: the check's skip, after :data:`REMEMBERED_IN_A_ROW` refusals
            from memory in a row and no example that ran.
    """
    description = exc.describe()
    same = is_remembered(exc) or check.last_refusal == description
    check.last_refusal = description
    check.record_unsupported(description)
    check.remembered_in_a_row = check.remembered_in_a_row + 1 if same else 1
    alike = is_call_refusal(exc) or refuses_its_family(check, exc)
    limit = CALL_REFUSALS_IN_A_ROW if alike else REMEMBERED_IN_A_ROW
    if check.remembered_in_a_row < limit:
        return
    if check.examples_ran == 0:
        raise skip_exception(check.unsupported_reason()) from None
    if alike:
        stop_after_this_example()  # what ran stands; more draws meet the same refusal


def refuses_its_family(check: Check, exc: Unsupported) -> bool:
    """Whether ``exc`` refuses a family every example of the check builds, so that every
    one meets it, whatever else it drew: the family the check is parametrized with
    (``family=fsdp`` in ``test_x[fsdp]``), or one of those its job declares it builds in
    every example (:func:`harness.run.remembered.built_families`: a job that draws no
    configuration, such as ``test_config``'s)."""
    if exc.option != "family":
        return False
    family = short_value(exc.value)
    return (bool(check.family_parameter) and family == check.family_parameter) or (
        family in built_families(exc)
    )


def is_call_refusal(exc: Unsupported) -> bool:
    """Whether ``exc`` refuses an argument of a call (``load_checkpoint(strict=False)``), not
    a configuration: its option is no ``StrategySpec`` field, so every example of the check
    that makes the call meets it, whatever configuration it drew."""
    return exc.option is not None and exc.option not in spec_field_names() | {"family"}


def note_job_ran() -> None:
    """A job of the running check came back from the ranks: an example did run."""
    current().job_ran()


@contextmanager
def skip_or_reject_unsupported() -> Iterator[None]:
    """Turn an ``Unsupported`` raised in the body into the right outcome.

    Inside a Hypothesis example the configuration is recorded and the example rejected;
    elsewhere the test is skipped with ``unsupported: option=value (reason)``.
    """
    try:
        yield
    except Unsupported as exc:
        current().refuse(exc)


def rejecting(
    inner: Callable[..., Any], check: Check, policy: ShrinkPolicy | None = None
) -> Callable[..., Any]:
    """Wrap a Hypothesis inner test: an ``Unsupported`` example takes the session's refusal
    path (recorded on the running check through its :class:`CheckWatch`, then rejected).

    Args:
        inner: the test's ``hypothesis.inner_test``.
        check: the running check; counts the examples that ran.
        policy: decides which examples of a failing check are still worth running
            (:mod:`harness.conformance.outcomes.economy`); None runs them all.
    """
    import hypothesis
    from hypothesis.errors import UnsatisfiedAssumption

    StopTest = stop_test_type()

    @functools.wraps(inner)
    def example(*args: Any, **kwargs: Any) -> Any:
        values = (*args, *kwargs.values())
        check.draws_in_body = any(is_data_object(v) for v in values)
        if policy is not None and policy.skip(check):
            hypothesis.reject()  # shrinking a known failure, or over the shrink budget
        try:
            result = inner(*args, **kwargs)
        except Unsupported as exc:
            current().refuse(exc)
        except UnsatisfiedAssumption as exc:
            # a suite that caught Unsupported and called reject() itself: record it too (a
            # rejection the session's refuse() raised is *caused* by a refusal it recorded)
            if exc.__cause__ is None and isinstance(exc.__context__, Unsupported):
                current().record_refusal(exc.__context__)
            raise
        except StopTest:
            raise  # Hypothesis ran out of data for this example: it did not run
        except BaseException as exc:
            check.examples_ran += 1
            if policy is not None and is_failure(exc):
                policy.failed(check, exc)
            raise
        check.examples_ran += 1
        return result

    return example
