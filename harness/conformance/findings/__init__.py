"""How failures become findings: what one failing check's failure is, and the grouping of
failures by root cause.

- :mod:`~harness.conformance.findings.signatures`: a failure's :class:`Attribution` (its
  clause, kind, masked message and place), read from the exception a check raised;
- :mod:`~harness.conformance.findings.masking`: the masked message a signature keys on;
- :mod:`~harness.conformance.findings.tracebacks`: where a failure was raised, and whose code
  each frame is;
- :mod:`~harness.conformance.findings.headlines`: one failure told in one line, what is wrong
  first;
- :mod:`~harness.conformance.findings.crash_site`: the clause a crashed rank was under, read
  from its fatal-error dump;
- :mod:`~harness.conformance.findings.checked_headline`: the headline of a load that failed
  on a checkpoint found right as written;
- :mod:`~harness.conformance.findings.grouping`: :class:`Finding` and :class:`Findings`,
  failures grouped by root cause, and each finding's kind;
- :mod:`~harness.conformance.findings.one_cause`: the same raise met by checks of other
  clauses joins one finding;
- :mod:`~harness.conformance.findings.examples`: a finding's example.

What a session does with them (which check a finding blocks, when a run stops) is
:mod:`harness.conformance.outcomes.triage`'s.
"""
