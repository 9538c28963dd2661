"""The rank side of rank coverage: measure this process, save after every job and at exit.

Call :func:`start_from_env` once, early in a rank process, and :func:`save` after each job.
Without the environment variable :data:`~harness.rank.coverage_config.ENV_VAR` both are
no-ops (one environment lookup at start, one ``None`` check per job). With it, coverage
measures the configured packages in this process and writes one data file per process,
``<data_dir>/.coverage.rank<R>.pid<PID>.<random>``. Saving after every job matters: a rank
that hangs or crashes is SIGKILLed and would lose whatever was not yet on disk.

Attach mode (``torchrun``) ranks call the same :func:`start_from_env` with their rank; the
variable may be set any way (exported before ``torchrun``, or by the launcher), for example
``SHARDCHECK_RANK_COVERAGE='{"data_dir": "/abs/dir", "sources": ["reference_impl"]}'``;
combine afterwards with ``python -m harness.rankcoverage /abs/dir``.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import secrets
import sys
from multiprocessing import util
from typing import Any

from harness.rank.coverage_config import ENV_VAR, RankCoverageConfig

__all__ = ["data_file_for", "save", "start", "start_from_env", "stop_and_save"]

_cov: Any = None  # the running coverage.Coverage of this process, if any
_save_failed = False
QUIET = ["module-not-imported", "module-not-measured", "no-data-collected", "already-imported"]


def data_file_for(config: RankCoverageConfig) -> str:
    """The base name every process's data file starts with (``<data_dir>/.coverage``)."""
    return os.path.join(config.data_dir, ".coverage")


def start_from_env(rank: int) -> None:
    """Start measuring this rank process if :data:`ENV_VAR` asks for it (else do nothing).

    Args:
        rank: this process's rank (part of its data file's name).

    Raises:
        ValueError: the variable is set but malformed (the message shows the expected form).
    """
    text = os.environ.get(ENV_VAR)
    if not text:
        return
    start(RankCoverageConfig.from_json(text), f"rank{rank}")


def start(config: RankCoverageConfig, role: str) -> Any:
    """Start coverage in this process; its data file's suffix is ``<role>.pid<PID>.<random>``.

    Args:
        config: what to measure and where.
        role: ``controller`` or ``rank<N>``.

    Returns:
        The started ``coverage.Coverage`` (already running ones are returned as is).
    """
    global _cov
    if _cov is not None:
        return _cov
    import coverage

    os.makedirs(config.data_dir, exist_ok=True)
    include = None if role == "controller" else _include_patterns(config.sources)
    cov = coverage.Coverage(
        data_file=data_file_for(config),
        data_suffix=f"{role}.pid{os.getpid()}.{secrets.token_hex(3)}",
        source_pkgs=list(config.sources) if include is None else None,
        include=include,
        branch=config.branch,
        config_file=False,
        auto_data=False,
    )
    cov.set_option("run:disable_warnings", QUIET)
    cov.start()
    _cov = cov
    atexit.register(save)  # torchrun ranks and the controller exit through atexit
    util.Finalize(None, save, exitpriority=100)  # forked ranks exit through multiprocessing
    return cov


def _include_patterns(sources: tuple[str, ...]) -> list[str] | None:
    """File patterns of ``sources``, or None when one cannot be located without importing.

    Ranks measure by file pattern rather than by package: coverage then skips its search for
    never-executed source files on every save (the controller records those), which makes a
    save after each job about ten times cheaper.
    """
    patterns = []
    for name in sources:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None)
        if origin is None:
            if "." in name:
                return None  # find_spec would import the parents before measuring starts
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                return None
            origin = spec.origin if spec is not None else None
        if not origin or not origin.endswith(".py"):
            return None
        origin = os.path.realpath(origin)
        if os.path.basename(origin) == "__init__.py":
            patterns.append(os.path.join(os.path.dirname(origin), "*"))
        else:
            patterns.append(origin)
    return patterns


def save() -> None:
    """Write what this process measured since the last save (no-op when not measuring).

    Never raises: a failure is reported once on stderr and measuring goes on.
    """
    global _save_failed
    if _cov is None:
        return
    try:
        _cov.save()
    except Exception as exc:
        if not _save_failed:
            _save_failed = True
            print(f"shardcheck rank coverage: could not save data: {exc!r}", file=sys.stderr)


def stop_and_save() -> None:
    """Stop measuring this process and write its data (the controller at session end)."""
    global _cov
    if _cov is None:
        return
    cov, _cov = _cov, None
    try:
        cov.stop()
        cov.save()
    except Exception as exc:
        print(f"shardcheck rank coverage: could not save data: {exc!r}", file=sys.stderr)
