"""Controller side: what runs in the pytest process, never inside a rank job.

:mod:`~suites.lib.controller.scenarios` and :mod:`~suites.lib.controller.checkpoint_plans`
draw what to run, :mod:`~suites.lib.controller.regressions` fixes examples of it,
:mod:`~suites.lib.controller.dispatch` sends a job to the ranks,
:mod:`~suites.lib.controller.oracles` (with :mod:`~suites.lib.controller.tolerances`) and
:mod:`~suites.lib.controller.checkpoint_checks` judge what came back,
:mod:`~suites.lib.controller.cuda_env` decides whether CUDA-only checks can run, and
:mod:`~suites.lib.controller.clauses` lists the clause ids the suites must cover.
"""
