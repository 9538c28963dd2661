"""Coverage across ranks: measure a package in the controller and every rank, then combine.

- :mod:`harness.rankcoverage.plugin`: the pytest plugin (``--rank-coverage``).
- :mod:`harness.rank.coverage`: what a rank process calls (``start_from_env``, ``save``).
- :mod:`harness.rankcoverage.combine`: merge the per-process data files, write the reports.
- ``python -m harness.rankcoverage DIR``: combine and report a directory by hand (attach mode).
"""

from __future__ import annotations

from harness.rank.coverage import save, start_from_env
from harness.rank.coverage_config import ENV_VAR, RankCoverageConfig

__all__ = ["ENV_VAR", "RankCoverageConfig", "save", "start_from_env"]
