"""What a conformance run prints and writes: the report's data, the terminal's lines, the JUnit
file's properties.

- :mod:`~harness.conformance.output.report_data`: the session's report (the checks, the
  findings, the facts of the run), built at its end;
- :mod:`~harness.conformance.output.progress`: each new finding the moment it is found, and
  how far a long run has come;
- :mod:`~harness.conformance.output.summary`: the clause summary at the end of the run (and
  the strict verdict's line);
- :mod:`~harness.conformance.output.junit`: check ids, clauses, outcomes and findings as
  ``--junitxml`` properties;
- :mod:`~harness.conformance.output.facts` and
  :mod:`~harness.conformance.output.provenance`: what ``report.json`` records about the run
  (versions, environment, strategy, reproducers; the command, commit and machine);
- :mod:`~harness.conformance.output.coverage`: the pairs of configuration values the checks
  exercised (``report.json``'s ``coverage``).

The report's model and its writers are :mod:`harness.report`'s.
"""
