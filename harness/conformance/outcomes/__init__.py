"""How each check gets its outcome, and the strict verdict on the run.

- :mod:`~harness.conformance.outcomes.checks`: :class:`Check` (one collected test and what
  became of it), check ids, the outcome each phase report implies, the expected-failures
  file;
- :mod:`~harness.conformance.outcomes.unsupported`: ``Unsupported`` under pytest and
  Hypothesis (the skip, or record-and-reject per example);
- :mod:`~harness.conformance.outcomes.economy`: shrink budgets and remembered refusals, and
  the clauses a failure breaks;
- :mod:`~harness.conformance.outcomes.triage`: each failing check's finding, ``blocked``
  checks, late violations, stopping a run that fails the same way everywhere;
- :mod:`~harness.conformance.outcomes.distinct` and
  :mod:`~harness.conformance.outcomes.several`: a check whose Hypothesis search met several
  distinct failures (its failure text, and its outcome);
- :mod:`~harness.conformance.outcomes.replay`: ``--reproduce-failure``, one check's failing
  example replayed;
- :mod:`~harness.conformance.outcomes.strict`: ``--conformance-strict``'s verdict on the run.

What one failure is and how failures group into findings is
:mod:`harness.conformance.findings`'s.
"""
