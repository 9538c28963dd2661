"""Attach mode: drive the ranks of a torchrun run (one or several nodes) from one controller.

Start it with ``torchrun --nnodes N --nproc-per-node G -m harness.attach -- pytest ARGS``:
every torchrun process becomes a rank (:mod:`harness.rank.attached`), rank 0 also starts the
controller (``pytest``) beside it (:mod:`harness.attach.__main__`), and the controller's
plugin drives the ranks through torchrun's store (:mod:`harness.pool.transports.store`).
The keys they share are listed in :mod:`harness.wire.attach`.
"""
