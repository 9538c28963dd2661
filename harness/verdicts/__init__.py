"""Verdicts: what a job's outcomes on every rank mean, named and attributed.

- :mod:`~harness.verdicts.outcomes`: one :class:`Outcome` per rank and the story of a failure.
- :mod:`~harness.verdicts.failures`: desync, lonely collective, or the generic failure.
- :mod:`~harness.verdicts.attribution`: which clause a failure breaks.
- :mod:`~harness.verdicts.collectives`, :mod:`~harness.verdicts.flight`: the collectives each
  rank entered (checked on the ranks, read from errors, stacks and NCCL's flight recorder).
- :mod:`~harness.verdicts.rankwarnings`: the ranks' warnings, folded for the summary.
"""
