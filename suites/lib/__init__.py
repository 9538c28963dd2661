"""The suites' helpers, laid out by where they run; the tests are the ``suites/test_*.py``.

- :mod:`suites.lib.controller`: runs in the pytest process. Hypothesis strategies that draw
  scenarios and checkpoint plans, the fixed regression examples, dispatching a job to the
  ranks, the single-process reference and the comparisons with it, tolerances, the CUDA gate
  and the suites' list of clauses.
- :mod:`suites.lib.ranks`: runs on the ranks. Every job the suites send there, one module per
  area (a ``suites/test_*.py`` module sends jobs but defines none: ``tests/test_layout.py``),
  and what the jobs call: building strategies through the plug-in contract, set-up and
  training, readers of gathered state and of the structure torch built.
- :mod:`suites.lib.shared`: what both sides use: the model zoo, the scenario and checkpoint
  plan dataclasses (data drawn in the controller, built into objects on the ranks), the
  tensor-parallel plans an ``MPConfig`` builds, and file digests.

Imports go one way: ``shared`` imports neither of the other two, and ``controller`` and
``ranks`` do not import each other; a test module imports what it needs from all three.
"""
