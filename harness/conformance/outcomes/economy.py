"""Spend machine time on new information: shrink budgets and remembered refusals.

- **Shrink budget.** Hypothesis shrinks a failure by running smaller examples, each a rank
  job. Per profile, a check's shrinking stops after :data:`SHRINK_SECONDS` (``ci`` 20 s,
  ``dev`` 2 minutes, ``nightly`` Hypothesis' own limits; ``--shrink-budget`` overrides):
  the examples it would still try are rejected without a job, and Hypothesis reports the
  smallest failing example found so far (replayed for real).
- **Known failures.** A failure whose signature an earlier check already found is not shrunk
  again: the first example that shows it is reported as it is (the report links the finding).
- **Remembered refusals.** An ``Unsupported`` that names an option and value is remembered
  for the session and family (:mod:`harness.run.remembered`). A strategy that refuses
  only a combination of values raises ``Unsupported`` without ``option``. A check whose
  examples were refused from memory (or with the same refusal) :data:`REMEMBERED_IN_A_ROW`
  times in a row, none having run, is ``unsupported`` at once (Hypothesis would otherwise draw
  hundreds more). A method that refuses an argument of its call (an ``Unsupported`` whose
  option is no ``StrategySpec`` field: ``load_checkpoint(..., strict=False)``) refuses every
  example of the check alike: :data:`CALL_REFUSALS_IN_A_ROW` such refusals in a row end the
  check, ``unsupported`` when nothing ran, else with what ran. So does a refusal of the
  family a check is parametrized with (``family=fsdp`` in ``test_x[fsdp]``), or of one its
  job declares it builds in every example (a job that draws no configuration, only values
  of options: ``test_config``'s): every example of that check builds the family. The check
  that first meets a refusal does not use the memory it taught (its replays must behave
  alike), so this limit is what ends it early.

Hypothesis has no setting for a per-failure shrink budget (only ``phases``, and its internal
five-minute limit), so once the budget is spent the search is ended after the running example
(:func:`harness.run.shrinking.stop_after_this_example`, Hypothesis' own deadline moved into the
past); a test that does not draw in its body also has that example rejected unrun. Outside
Hypothesis' search nothing changes.
"""

from __future__ import annotations

import time

from harness.conformance.findings.grouping import Findings
from harness.conformance.findings.signatures import Attribution, attribute
from harness.conformance.outcomes.checks import Check
from harness.run.shrinking import (
    first_failure_time,
    in_engine,
    shrink_once,
    stop_after_this_example,
)
from harness.verdicts.attribution import last_looked_failure

__all__ = [
    "CALL_REFUSALS_IN_A_ROW",
    "REMEMBERED_IN_A_ROW",
    "SHRINK_SECONDS",
    "ShrinkPolicy",
    "attributed_clauses",
]

#: examples in a row refused from memory or alike, none run, before a check is unsupported
REMEMBERED_IN_A_ROW = 20
#: examples in a row whose call a method refused alike (``load_checkpoint(strict=False)``:
#: the refusal does not depend on the configuration drawn) before the check stops drawing
CALL_REFUSALS_IN_A_ROW = 3

#: seconds of shrinking per failing check, by Hypothesis profile (None: Hypothesis' limits)
SHRINK_SECONDS: dict[str, float | None] = {"ci": 20.0, "dev": 120.0, "nightly": None}


def attributed_clauses(check_clauses: list[str], attribution: Attribution) -> tuple[list[str], str]:
    """The clauses a failure breaks, and the clause that blocked the check (or ``""``).

    A failure tagged with one of the check's clauses breaks that one; tagged with another
    clause, it breaks that one and blocks the check; untagged, it breaks all the check's.
    """
    tag = attribution.clause
    if not tag:
        return list(check_clauses), ""
    if tag in check_clauses:
        return [tag], ""
    return [tag], tag


class ShrinkPolicy:
    """Decides, per example of a failing check, whether it is worth a rank job.

    Args:
        budget_s: seconds of shrinking per failing check, or None for no limit.
        findings: the session's findings (a failure already found is not shrunk again).
    """

    def __init__(self, budget_s: float | None, findings: Findings) -> None:
        self.budget_s = budget_s
        self.findings = findings

    def skip(self, check: Check) -> bool:
        """Before an example: whether to reject it unrun (the check's failure is known or its
        shrink budget is spent). Either way the search then ends after this example.

        A test that draws in its body (``st.data()``) runs the example all the same: rejected
        before its draws, an example Hypothesis had run further would conclude earlier than
        it did, which Hypothesis reports as inconsistent data generation.
        """
        if check.first_failure_at is None:
            return False
        spent = time.perf_counter() - check.first_failure_at
        over = self.budget_s is not None and spent > self.budget_s
        if not (check.stop_shrinking or over) or not in_engine():
            return False
        check.search_ended = stop_after_this_example()
        return not check.draws_in_body

    def before_job(self, check: Check) -> None:
        """Before each rank job of ``check``: once its shrink budget is spent since
        Hypothesis found its first failure, end the search after the running example.

        This covers what :meth:`skip` cannot see: a state machine's steps, and tests that
        run jobs after their first failure in one example. A failure a known finding explains
        ends the search at once, whatever the budget (a blocked state machine is not shrunk).
        """
        if check.search_ended:
            return
        # a state machine's failure is not seen before its search ends: the one that escaped
        # harness.looking is, and a known finding may already explain it (the cheap test
        # first: first_failure_time walks the stack, and this runs before every job)
        looked = None if check.stop_shrinking else last_looked_failure()
        if (
            looked is not None
            and first_failure_time() is not None
            and self.findings.explaining(attribute(looked, check.clauses))
        ):
            check.stop_shrinking = True
        if check.stop_shrinking:  # its failure is a known finding's: no more examples
            check.search_ended = stop_after_this_example()
            return
        if self.budget_s is None:
            return
        found = first_failure_time()
        if found is not None and time.monotonic() - found > self.budget_s:
            check.search_ended = stop_after_this_example()

    def failed(self, check: Check, exc: BaseException) -> None:
        """After a failing example: start the budget; stop at once if the failure is known."""
        if check.first_failure_at is None:
            check.first_failure_at = time.perf_counter()
        attribution = self.findings.settle(attribute(exc, check.clauses), check.clauses)
        clauses, _ = attributed_clauses(check.clauses, attribution)
        known = (
            self.findings.match(attribution, clauses)
            or self.findings.explaining(attribution)
            or self.findings.same_cause(attribution, clauses)
        )
        if known is not None and known.first_check != check.id:
            check.stop_shrinking = True
            shrink_once()
