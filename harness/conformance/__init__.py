"""pytest wiring for conformance: clause markers, outcomes, selection, strictness, the report.

Loaded as its own plugin (entry point ``shardcheck_conformance``, or ``-p harness.conformance``).
Every collected test is a *check* with a stable id (``<suite module>.<test>[<param id>]``)
and the contract's clauses (:mod:`harness.clauses`, ``CONTRACT.md``) of its
``@pytest.mark.clause(...)`` markers. Each check ends with one outcome (``passed``,
``failed``, ``error``, ``unsupported``, ``environment``, ``xfailed``, or ``not run`` for a
check an interrupted or stopped session never reached); a deselected check is listed in the
report's ``selection``. Failures are grouped into findings, one per root cause, each under the
clause it breaks (:mod:`~harness.conformance.findings`); a check stopped by another clause's
violation is ``blocked``. ``--list-clauses`` prints the contract and exits.

Modules: :mod:`~harness.conformance.checks` (ids, outcomes, the expected-failures file),
:mod:`~harness.conformance.unsupported` (``Unsupported`` under pytest and Hypothesis),
:mod:`~harness.conformance.session` (the hooks of one session),
:mod:`~harness.conformance.facts` (environment, strategy, reproducers),
:mod:`~harness.conformance.signatures` (what one failure is), :mod:`~harness.conformance.findings`
(failures grouped by root cause),
:mod:`~harness.conformance.triage` (clause isolation, late violations, stopping early),
:mod:`~harness.conformance.economy` (shrink budgets),
:mod:`~harness.conformance.coverage` (pairs of configuration values exercised).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from harness.conformance.checks import check_id
from harness.conformance.session import ConformancePlugin, _parse_clauses
from harness.conformance.unsupported import record_unsupported, skip_or_reject_unsupported

__all__ = [
    "ConformancePlugin",
    "check_id",
    "record_unsupported",
    "skip_or_reject_unsupported",
]

PLUGIN_NAME = "shardcheck-conformance-session"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--clauses``, ``--expected-failures``, ``--conformance-strict/-report``."""
    group = parser.getgroup("shardcheck-conformance", "shardcheck conformance report")
    group.addoption(
        "--clauses",
        default=None,
        metavar="LIST",
        help="run only checks declaring a matching clause: comma-separated ids or globs "
        "(e.g. CKPT-RT-3,CLIP-1 or 'CKPT-*'); the others are deselected.",
    )
    group.addoption(
        "--list-clauses",
        action="store_true",
        default=False,
        help="print the contract's clauses (only those --clauses selects, if given) and exit.",
    )
    group.addoption(
        "--expected-failures",
        default=None,
        metavar="FILE",
        help="file of 'CHECK_ID  reason' lines (# comments): those checks are strict xfails; "
        "'finding:CLAUSE  reason' expects a late finding of CLAUSE (a raising teardown).",
    )
    group.addoption(
        "--conformance-strict",
        action="store_true",
        default=False,
        help="fail the run if any check is not passed or environment (unsupported, xfailed, "
        "error, failed), so an all-skipped run never looks green.",
    )
    group.addoption(
        "--shrink-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds Hypothesis may spend shrinking one failing check (0: no limit); default "
        "by profile: ci 20, dev 120, nightly Hypothesis' own limits. A failure another check "
        "already found is not shrunk again.",
    )
    group.addoption(
        "--conformance-report",
        default=None,
        metavar="DIR",
        help="write report.json and report.md (outcomes by check and by clause) into DIR.",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``clause`` marker and this session's :class:`ConformancePlugin`."""
    config.addinivalue_line(
        "markers",
        "clause(*ids): the contract's clause ids this check verifies (e.g. 'CKPT-RT-3').",
    )
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(ConformancePlugin(config), PLUGIN_NAME)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """Check ``--clauses`` and ``--conformance-report`` before any plugin is configured (so
    before any rank starts); ``--list-clauses``: print the contract (or the ``--clauses``
    selection) and exit 0."""
    if getattr(config.option, "help", False) or getattr(config.option, "version", False):
        return None
    from harness.clauses import UnknownClauseError, select
    from harness.clauses.markdown import render_listing

    patterns = config.getoption("clauses")
    try:
        ids = select(patterns) if _parse_clauses(patterns) else None
    except UnknownClauseError as exc:
        raise pytest.UsageError(f"--clauses: {exc}") from None
    if config.getoption("list_clauses"):
        print(render_listing(ids), end="")
        return 0
    check_report_dir(config.getoption("conformance_report"))
    return None


def check_report_dir(directory: str | None) -> None:
    """Make ``--conformance-report DIR`` if missing and prove it writable (a probe file is
    created and removed), so an unwritable one is refused at start-up, not after the run.

    Raises:
        pytest.UsageError: the directory cannot be made or written to.
    """
    if not directory:
        return
    step = "create the directory"
    try:
        if os.path.lexists(directory) and not os.path.isdir(directory):
            raise NotADirectoryError(errno.ENOTDIR, "it exists and is not a directory")
        Path(directory).mkdir(parents=True, exist_ok=True)
        step = "create a file in it"
        handle, probe = tempfile.mkstemp(prefix=".shardcheck-probe-", dir=directory)
        os.close(handle)
        os.remove(probe)
    except OSError as exc:
        why = f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)
        raise pytest.UsageError(
            f"--conformance-report={directory!r}: cannot {step}: {why}; pass a directory "
            "you can write to, e.g. --conformance-report ./conformance-report."
        ) from None
