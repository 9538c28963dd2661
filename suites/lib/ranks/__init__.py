"""Rank side: every function that runs on the ranks, the jobs and what they call.

The rule: a function the suites send to the ranks (with
:func:`suites.lib.controller.dispatch.run`, ``harness.run_on_ranks``, or as a
``SessionDriver``'s ``job`` or ``probe``) is defined here, in the module of its area, and a
``suites/test_*.py`` module keeps only the check: its strategies and draws, the send and the
comparisons in the controller. ``tests/test_layout.py`` fails for a job sent from the test
module that defines it.

Helpers: :mod:`~suites.lib.ranks.training` sets a scenario up through the plug-in contract
and trains it (:func:`~suites.lib.ranks.training.train_rank`, the parity checks' job),
:mod:`~suites.lib.ranks.construction` builds strategies for the configuration checks, and
:mod:`~suites.lib.ranks.readers` and :mod:`~suites.lib.ranks.structure` read the gathered
state and the structure torch built with torch's own APIs.

Jobs, one module per area: :mod:`~suites.lib.ranks.api_probes` (API),
:mod:`~suites.lib.ranks.training_jobs`, :mod:`~suites.lib.ranks.sharding_jobs`,
:mod:`~suites.lib.ranks.model_parallel_jobs`, :mod:`~suites.lib.ranks.precision_jobs`,
:mod:`~suites.lib.ranks.config_jobs` (CFG), :mod:`~suites.lib.ranks.checkpoint_jobs` (the
round trips, and the checkpoint suites' helpers), :mod:`~suites.lib.ranks.checkpoint_refusal_jobs`,
:mod:`~suites.lib.ranks.checkpoint_save_jobs`, :mod:`~suites.lib.ranks.checkpoint_interop_jobs`,
:mod:`~suites.lib.ranks.resume_jobs`, :mod:`~suites.lib.ranks.session_jobs` (TRAIN-4) and
:mod:`~suites.lib.ranks.cuda_jobs`. Jobs are module-level functions: the harness finds them on
the ranks by module and name.
"""
