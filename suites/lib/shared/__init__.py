"""Shared by both sides: data that crosses from the controller to the ranks, and its builders.

:mod:`~suites.lib.shared.models` is the model zoo (the controller's reference and the ranks
build the same models), :mod:`~suites.lib.shared.specs` the scenario dataclasses (drawn in
the controller, built into policies, optimizers and a ``parallelize_fn`` on the ranks),
:mod:`~suites.lib.shared.parallelize` the tensor-parallel plans an ``MPConfig`` builds,
:mod:`~suites.lib.shared.checkpoint_specs` the checkpoint plans and the metadata saved with
them, :mod:`~suites.lib.shared.files` digests of files on disk,
:mod:`~suites.lib.shared.session_ops` the operations of a training session (TRAIN-4), and
:mod:`~suites.lib.shared.axes` the configuration axes a scenario exercises (coverage).
"""
