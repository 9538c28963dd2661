"""The rank pool and its transports: how the controller starts, reaches, waits for and heals
its ranks.

- :mod:`~harness.pool.rankpool`: :class:`RankPool`, the policy (dispatch, deadlines, health, heal).
- :mod:`~harness.pool.transport`: the :class:`Transport` protocol a pool drives;
  :mod:`~harness.pool.transports`: the registry and the two transports (local pipes,
  torchrun's store).
- :mod:`~harness.pool.stall`, :mod:`~harness.pool.heals`, :mod:`~harness.pool.resources`: stalls
  noticed early, restarts counted, world sizes the machine cannot hold refused.
"""
