"""One run of the harness: the session and what it learns while jobs run.

- :mod:`~harness.run.session`: :class:`HarnessSession`, everything one run holds;
  :mod:`~harness.run.sessionplugin`: its pytest hooks.
- :mod:`~harness.run.jobs`: one job checked, dispatched, replayed and judged.
- :mod:`~harness.run.deadlines`, :mod:`~harness.run.remembered`, :mod:`~harness.run.shrinking`:
  deadlines learned, refusals remembered, hangs shrunk once.
"""
