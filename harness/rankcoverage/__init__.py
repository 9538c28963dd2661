"""Coverage across ranks: measure a package in the controller and every rank, then combine.

- :mod:`harness.rankcoverage.plugin`: the pytest plugin (``--rank-coverage``).
- :mod:`harness.rankcoverage.rank`: what a rank process calls (``start_from_env``, ``save``).
- :mod:`harness.rankcoverage.combine`: merge the per-process data files, write the reports.
- ``python -m harness.rankcoverage DIR``: combine and report a directory by hand (attach mode).
"""

from __future__ import annotations

from harness.rankcoverage.config import ENV_VAR, RankCoverageConfig
from harness.rankcoverage.rank import save, start_from_env

__all__ = ["ENV_VAR", "RankCoverageConfig", "save", "start_from_env"]
