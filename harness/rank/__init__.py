"""The rank side: what runs inside a rank process, whichever transport reaches it.

- :mod:`~harness.rank.worker`: a local rank's process (join once, run jobs until told to stop);
  :mod:`~harness.rank.attached`: the same for a torchrun rank (attach mode).
- :mod:`~harness.rank.runner`: runs one command (job, state, barrier) with isolation
  (:mod:`~harness.rank.isolation`) and output capture; :mod:`~harness.rank.context` is what a
  rank function receives; :mod:`~harness.rank.warmup` the first-start warm-up step.
- :mod:`~harness.rank.coverage` (with :mod:`~harness.rank.coverage_config`): the rank side of
  ``--rank-coverage`` (:mod:`harness.rankcoverage`).
"""
