"""Names the pytest plugins' options need, in a module that imports nothing.

The plugins load in every pytest run of an environment where shardcheck is installed; their
``pytest_addoption`` uses these, so they live apart from :mod:`harness.config` and
:mod:`harness.contract` (which import torch).
"""

from __future__ import annotations

__all__ = ["BACKENDS", "DEFAULT_FACTORY", "STRATEGY_ENV"]

BACKENDS = ("auto", "gloo", "nccl")
#: the strategy factory when neither ``--strategy`` nor :data:`STRATEGY_ENV` names one
DEFAULT_FACTORY = "reference_impl:make_strategy"
#: the environment variable ``--strategy`` defaults to
STRATEGY_ENV = "SHARDCHECK_STRATEGY"
