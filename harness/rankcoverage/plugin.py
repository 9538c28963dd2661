"""pytest plugin ``shardcheck_coverage``: line and branch coverage measured on every rank.

``--rank-coverage[=PKG[,PKG]]`` (default ``reference_impl``) measures those packages in the
controller (the pytest process) and in every rank process, and combines the data at the end
of the session; ``--rank-coverage-dir DIR`` (default ``reports/rank-coverage``) holds the
per-process data files, the combined ``.coverage`` and the reports.

The settings reach the ranks through :data:`~harness.rank.coverage_config.ENV_VAR`, which
must be set before ``harness.plugin`` starts the forkserver (ranks inherit the forkserver's
environment): this plugin sets it as early as pytest allows (while the initial conftests
load, or first thing in ``pytest_configure``). The controller is measured too: it imports
the strategy module, so the module-level lines the ranks inherit from the forkserver are
counted there.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from harness.entry import inplay
from harness.rank import coverage as rank
from harness.rank.coverage_config import (
    DEFAULT_SOURCE,
    ENV_VAR,
    RankCoverageConfig,
    parse_sources,
    require_coverage,
)
from harness.rankcoverage.combine import CoverageSummary, clear_data, combine_and_report

__all__: list[str] = []

DEFAULT_DIR = os.path.join("reports", "rank-coverage")


class _State:
    """This session's rank-coverage run (stashed on the config)."""

    def __init__(self, config: RankCoverageConfig, previous_env: str | None) -> None:
        self.config = config
        self.previous_env = previous_env
        self.summary: CoverageSummary | None = None
        self.error: str | None = None


_STATE = pytest.StashKey[_State]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--rank-coverage`` and ``--rank-coverage-dir``."""
    group = parser.getgroup("shardcheck", "shardcheck rank pool")
    group.addoption(
        "--rank-coverage",
        nargs="?",
        const=DEFAULT_SOURCE,
        default=None,
        metavar="PKG[,PKG]",
        help=f"measure line and branch coverage of these packages (default {DEFAULT_SOURCE}) "
        "on every rank and in the controller, combined at session end",
    )
    group.addoption(
        "--rank-coverage-dir",
        default=None,
        metavar="DIR",
        help=f"data files and reports of --rank-coverage (default {DEFAULT_DIR})",
    )
    inplay.remember_options(group)


def _settings(options: Any) -> RankCoverageConfig | None:
    value = getattr(options, "rank_coverage", None)
    directory = getattr(options, "rank_coverage_dir", None)
    if value is None:
        if directory is not None:
            raise pytest.UsageError(
                f"--rank-coverage-dir={directory!r} has no effect without --rank-coverage; "
                "add --rank-coverage (or drop --rank-coverage-dir)."
            )
        return None
    try:
        sources = parse_sources(value)
        require_coverage()
    except (ValueError, ImportError) as exc:
        raise pytest.UsageError(str(exc)) from None
    path = os.path.abspath(directory or DEFAULT_DIR)
    if os.path.exists(path) and not os.path.isdir(path):
        raise pytest.UsageError(
            f"--rank-coverage-dir={directory!r} is a file, not a directory; "
            "name a directory (it is created if missing)."
        )
    return RankCoverageConfig(path, sources, branch=True)


def _activate(config: pytest.Config, options: Any) -> None:
    if config.stash.get(_STATE, None) is not None:
        return
    if getattr(options, "help", False) or getattr(options, "version", False):
        return
    settings = _settings(options)
    if settings is None:
        return
    import coverage

    running = coverage.Coverage.current()
    if running is not None:
        raise pytest.UsageError(
            "--rank-coverage cannot run while another coverage measurement is active in "
            "this process (pytest-cov or `coverage run`); drop one of them."
        )
    os.makedirs(settings.data_dir, exist_ok=True)
    clear_data(settings.data_dir)
    config.stash[_STATE] = _State(settings, os.environ.get(ENV_VAR))
    os.environ[ENV_VAR] = settings.to_json()  # before the forkserver starts: ranks inherit it
    rank.start(settings, "controller")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Start measuring before conftests and test modules import the measured packages."""
    _activate(early_config, early_config.known_args_namespace)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Start here when the plugin was registered too late for the earlier hook."""
    _activate(config, config.option)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the pools (every rank saves), stop the controller, combine and report."""
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    import harness.api as api

    api.shutdown()
    rank.stop_and_save()
    try:
        state.summary = combine_and_report(state.config.data_dir, state.config.sources)
    except Exception as exc:
        state.error = f"rank coverage: combining the data failed: {type(exc).__name__}: {exc}"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print the combined figures in one line."""
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    if state.error:
        terminalreporter.write_line(state.error, red=True)
    elif state.summary is not None:
        terminalreporter.write_line(state.summary.line())


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop measuring (also after a usage error) and restore the environment variable."""
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    rank.stop_and_save()
    if state.previous_env is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ[ENV_VAR] = state.previous_env
