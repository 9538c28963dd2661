"""Rank side: what runs inside ``run_on_ranks`` jobs, on every rank of the job.

:mod:`~suites.lib.ranks.training` sets a scenario up through the plug-in contract and trains
it, :mod:`~suites.lib.ranks.construction` builds strategies for the configuration checks,
:mod:`~suites.lib.ranks.readers` and :mod:`~suites.lib.ranks.structure` read the gathered
state and the structure torch built with torch's own APIs, and
:mod:`~suites.lib.ranks.api_probes`, :mod:`~suites.lib.ranks.checkpoint_jobs` and
:mod:`~suites.lib.ranks.cuda_jobs` are the jobs of the API, checkpoint and CUDA suites. Jobs
are module-level functions: the harness finds them on the ranks by module and name.
"""
