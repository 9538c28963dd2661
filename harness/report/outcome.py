"""The outcomes of a check, and what each one means for the run, its findings and its clauses.

Every writer (the terminal summary, ``summary.md``, ``report.md``, ``report.html``, the
``--junitxml`` properties and ``report.json``) asks :class:`Outcome` rather than keeping a
list of its own, so that "failing" means the same everywhere.

======================  ==========  =============  ===============  ==================
outcome                 fails the   joins a        counts against   conforms under
                        run         finding        its clause       --conformance-strict
======================  ==========  =============  ===============  ==================
``passed``              no          no             no               yes
``failed``              yes         yes            yes              no
``desync``              yes         yes            yes              no
``hang``                yes         yes            yes              no
``error``               yes         no             yes              no
``blocked``             yes         yes            yes              no
``not run``             no [1]_     no             yes              no
``xfailed``             no          yes            yes              yes
``unsupported``         no          no             no [2]_          yes [3]_
``environment``         no          no             no [2]_          yes
``not applicable`` [4]_ no          no             no               yes
======================  ==========  =============  ===============  ==================

.. [1] the run is ``incomplete`` (pytest's own status says why it stopped).
.. [2] when a check of the clause passed; a clause whose every check is ``unsupported`` or
   ``environment`` reads that outcome.
.. [3] unless ``--require-whole-space`` is given, or the strategy ran nothing at all (see
   [Note: a strategy that offers a subset] in :mod:`harness.report.model`).
.. [4] an outcome of a clause, never of a check: the clause applies to none of the families
   the strategy offers (see [Note: not applicable] in :mod:`harness.report.model`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

__all__ = ["CHECK_OUTCOMES", "Outcome", "worst"]


class Outcome(str, Enum):
    """One check's outcome; its value is the word the reports print (and compares equal to
    that string, so ``check.outcome == Outcome.DESYNC`` works on the report's strings)."""

    def __str__(self) -> str:
        return self.value

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    UNSUPPORTED = "unsupported"
    ENVIRONMENT = "environment"
    XFAILED = "xfailed"
    NOT_RUN = "not run"
    DESYNC = "desync"
    HANG = "hang"
    BLOCKED = "blocked"
    #: a clause's, never a check's: it applies to no family the strategy offers
    NOT_APPLICABLE = "not applicable"

    @property
    def fails_run(self) -> bool:
        """Whether a check with this outcome fails the run whatever the options."""
        return self in _FAILS_RUN

    @property
    def joins_finding(self) -> bool:
        """Whether a check with this outcome belongs to a finding (a root cause): it failed,
        or a finding's failure blocked it, or it failed as the expected-failures file says."""
        return self in _JOINS_FINDING

    @property
    def counts_against_clause(self) -> bool:
        """Whether this outcome keeps the check's clause from reading ``passed``. A check the
        strategy declared ``unsupported``, or one that needs another ``environment``, does not
        count against a clause whose other checks ran and passed."""
        return self not in _NOT_AGAINST

    @property
    def is_failure(self) -> bool:
        """Whether the check has a failure to read (``report.md``'s Failures section): every
        outcome that fails the run, and the expected failures."""
        return self.fails_run or self is Outcome.XFAILED

    @property
    def did_not_run(self) -> bool:
        """Whether the check's property was never tested for lack of a strategy feature, an
        environment, or time (``unsupported``, ``environment``, ``not run``)."""
        return self in _DID_NOT_RUN

    @property
    def severity(self) -> int:
        """0 for the worst outcome; a clause (or a check's phases) takes the lowest."""
        return _SEVERITY.index(self)

    def conforms(self, whole_space: bool = False) -> bool:
        """Whether this outcome lets a ``--conformance-strict`` run exit 0: passed, failed as
        expected (``xfailed``), needs another environment, or (unless ``whole_space``)
        declared unsupported."""
        return self in _CONFORMING or (self is Outcome.UNSUPPORTED and not whole_space)

    @property
    def offered(self) -> bool:
        """Whether the strategy ran the check at all (it passed or failed as expected): a run
        with no offered check offered nothing to check."""
        return self in (Outcome.PASSED, Outcome.XFAILED)


_FAILS_RUN = frozenset(
    {Outcome.FAILED, Outcome.DESYNC, Outcome.HANG, Outcome.ERROR, Outcome.BLOCKED}
)
_JOINS_FINDING = frozenset(
    {Outcome.FAILED, Outcome.DESYNC, Outcome.HANG, Outcome.BLOCKED, Outcome.XFAILED}
)
_NOT_AGAINST = frozenset(
    {Outcome.PASSED, Outcome.UNSUPPORTED, Outcome.ENVIRONMENT, Outcome.NOT_APPLICABLE}
)
_DID_NOT_RUN = frozenset(
    {Outcome.UNSUPPORTED, Outcome.ENVIRONMENT, Outcome.NOT_RUN, Outcome.NOT_APPLICABLE}
)
_CONFORMING = frozenset(
    {Outcome.PASSED, Outcome.XFAILED, Outcome.ENVIRONMENT, Outcome.NOT_APPLICABLE}
)
#: worst first. A check that did not run is not known to hold, so ``not run`` ranks above
#: every skip; ``unsupported`` above ``environment`` (the strategy's choice, not the machine's),
#: and both above ``not applicable`` (nothing the strategy offers is asked for).
_SEVERITY = (
    Outcome.FAILED,
    Outcome.DESYNC,
    Outcome.HANG,
    Outcome.ERROR,
    Outcome.BLOCKED,
    Outcome.NOT_RUN,
    Outcome.XFAILED,
    Outcome.UNSUPPORTED,
    Outcome.ENVIRONMENT,
    Outcome.NOT_APPLICABLE,
    Outcome.PASSED,
)


#: The outcomes a check can have: every one but a clause's ``not applicable``.
CHECK_OUTCOMES = tuple(o for o in Outcome if o is not Outcome.NOT_APPLICABLE)


def worst(outcomes: Iterable[str]) -> Outcome:
    """The worst of ``outcomes`` (``passed`` if there are none)."""
    return min((Outcome(o) for o in outcomes), key=lambda o: o.severity, default=Outcome.PASSED)
