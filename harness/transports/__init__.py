"""The ways a :class:`harness.pool.RankPool` reaches its ranks (:mod:`harness.transport`):
:mod:`~harness.transports.pipes` for local ranks, :mod:`~harness.transports.store` for the
ranks of a torchrun run (attach mode)."""
