"""The hooks of one pytest session: checks from items, outcomes from reports, the report."""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Generator
from datetime import datetime, timezone
from typing import Any

import pytest

from harness.conformance.findings.examples import item_parameters
from harness.conformance.findings.grouping import Finding
from harness.conformance.findings.signatures import is_failure
from harness.conformance.outcomes.checks import (
    Check,
    check_id,
    classify_report,
    clauses_of,
    collector_id,
    failure_text,
    family_of,
    family_parameter,
    load_expected_failures,
    not_run_reason,
    world_sizes_of,
)
from harness.conformance.outcomes.distinct import describe
from harness.conformance.outcomes.replay import not_reproduced, replayed_nothing
from harness.conformance.outcomes.several import verdict_of_several
from harness.conformance.outcomes.strict import StrictVerdict, add_to_junit, strict_verdict
from harness.conformance.outcomes.triage import LATE_PREFIX, Triage, shrink_budget
from harness.conformance.outcomes.unsupported import CheckWatch, rejecting, skip_exception
from harness.conformance.output import facts, junit, report_data
from harness.conformance.output.progress import Progress, terminal_writer
from harness.conformance.output.summary import summary_wanted, write_summary
from harness.contract import Unsupported
from harness.report import NOT_RUN, Report, write_report
from harness.report.model import LISTED_PREFIX
from harness.run.session import HarnessSession, session_of
from harness.run.shrinking import quiet_slow_shrinking

__all__ = ["ConformancePlugin"]


def _parse_clauses(value: str | None) -> list[str]:
    if value is None:
        return []
    patterns = [p.strip().upper() for p in value.split(",") if p.strip()]
    if not patterns:
        raise pytest.UsageError(
            f"--clauses={value!r} names no clause; pass comma-separated ids or globs, "
            "e.g. --clauses 'CKPT-RT-3,CLIP-1' or --clauses 'CKPT-*'."
        )
    return patterns


class ConformancePlugin:
    """The per-session state: one :class:`Check` per collected test, and the report.

    Args:
        config: the pytest config (options are read from it).
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.patterns = _parse_clauses(config.getoption("clauses"))
        self.expected_file: str | None = config.getoption("expected_failures")
        listed = load_expected_failures(self.expected_file)
        #: ``finding:CLAUSE`` lines: a late finding of CLAUSE (e.g. a raising teardown) expected
        self.expected_late = {
            k.removeprefix(LATE_PREFIX): r for k, r in listed.items() if k.startswith(LATE_PREFIX)
        }
        self.expected = {k: r for k, r in listed.items() if not k.startswith(LATE_PREFIX)}
        self.checks: dict[str, Check] = {}  # by nodeid, in collection order
        self.collected_ids: set[str] = set()
        self.deselected: list[str] = []
        self.matched_patterns: set[str] = set()
        self.report: Report | None = None
        self.strict: StrictVerdict | None = None  # under --conformance-strict
        self.strict_alone = False  # the strict verdict alone failed the run
        self.triage = Triage(self.expected_late)
        self.progress = Progress(terminal_writer(config))
        #: test items to run and run so far: the progress line counts items, not checks, as
        #: ``--keep-duplicates`` runs one check (one node id) more than once
        self.items_total = 0
        self.items_done = 0
        self.started_at = datetime.now(timezone.utc)  # the report's run.started_at
        self.started = time.perf_counter()  # and its wall time

    @property
    def harness(self) -> HarnessSession:
        """The harness session of this run (the pool plugin's, when it is loaded)."""
        return session_of(self.config)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Take the session (to stop it) and the shrink budget of the loaded profile."""
        self.harness.remembered.clear()
        self.triage.start(session, shrink_budget(self.config))
        self.progress = Progress(terminal_writer(self.config))
        self.started_at, self.started = datetime.now(timezone.utc), time.perf_counter()

    # -- collection -----------------------------------------------------------------------

    def _selected(self, clauses: list[str]) -> bool:
        hits = {p for p in self.patterns for c in clauses if fnmatch.fnmatchcase(c.upper(), p)}
        self.matched_patterns |= hits
        return bool(hits)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Make a check per item, mark expected failures, deselect by ``--clauses``."""
        kept, dropped = [], []
        for item in items:
            clauses = clauses_of(item)
            check = Check(check_id(item), item.nodeid, clauses, world_sizes_of(item))
            check.family = family_of(item, clauses)
            check.family_parameter = family_parameter(item)
            check.params = item_parameters(item)
            junit.collected(item, check)
            self.checks[item.nodeid] = check
            self.collected_ids.add(check.id)
            reason = self.expected.get(check.id)
            if reason is not None:
                marker = pytest.mark.xfail(reason=f"{LISTED_PREFIX}{reason}", strict=True)
                item.add_marker(marker, append=False)
            if self.patterns and not self._selected(check.clauses):
                dropped.append(item)
            else:
                kept.append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The number of items the progress line counts down (after every deselection)."""
        self.items_total = len(session.items)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        """Move deselected items (``--clauses``, ``-k``, ``-m``) to the report's selection."""
        for item in items:
            check = self.checks.pop(item.nodeid, None)
            self.deselected.append(check.id if check else check_id(item))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A module that failed to import or skipped itself is a check too."""
        if report.passed or not report.nodeid:
            return
        check = Check(collector_id(self.config.rootpath, report.nodeid), report.nodeid, [])
        outcome, message = classify_report(report)
        check.settle(outcome or "error", message, failure_text(report))
        self.checks.setdefault(report.nodeid, check)

    # -- running --------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """Watch the item's check on the harness session: its jobs (shrink budget, examples
        that ran) and its refusals (``record_unsupported`` records on it)."""
        check = self.checks.get(item.nodeid)
        if check is None:
            return (yield)
        harness = self.harness
        before = harness.last_job_id
        harness.remembered.begin_check()
        watch = CheckWatch(check, self.triage.policy)
        try:
            with harness.observing(watch), quiet_slow_shrinking():
                return (yield)
        finally:
            check.rank_jobs += harness.last_job_id - before

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """An ``Unsupported`` raised by a fixture is the check's skip, not a setup error (the
        session's refusal path records it)."""
        try:
            return (yield)
        except Unsupported as exc:
            self.harness.refuse(exc)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """Turn ``Unsupported`` into the skip; per example under Hypothesis.

        See [Note: unsupported configurations] in :mod:`harness.conformance.outcomes.unsupported`.
        """
        from hypothesis.errors import DidNotReproduce, FailedHealthCheck, Unsatisfiable

        check = self.checks.get(item.nodeid) or Check("", item.nodeid, [])
        handle = getattr(getattr(item, "obj", None), "hypothesis", None)
        inner = getattr(handle, "inner_test", None)
        if inner is not None:
            handle.inner_test = rejecting(inner, check, self.triage.policy)  # type: ignore[union-attr]
        try:
            result = yield
        except Unsupported as exc:  # a test outside Hypothesis: the refusal path skips it
            self.harness.refuse(exc)
        except (Unsatisfiable, FailedHealthCheck):
            if check.unsupported and check.examples_ran == 0:
                raise skip_exception(check.unsupported_reason()) from None
            if check.unsupported and check.remembered_in_a_row > 0:
                return None  # what ran passed, the rest was refused: passed on what it offers
            raise
        except DidNotReproduce as exc:  # --reproduce-failure's example did not fail
            raise not_reproduced(check.id or item.nodeid, exc) from None
        except BaseException as exc:
            if is_failure(exc) and check.id:
                self._announce(self.triage.attribute(check, exc), item)
                several = describe(exc, check.clauses)
                if several is not None:
                    check.distinct, check.distinct_notes = several.listing, several.notes
                    check.several_verdict = verdict_of_several(exc)
            raise
        finally:
            if inner is not None:
                handle.inner_test = inner  # type: ignore[union-attr]
        if inner is not None and check.unsupported and check.examples_ran == 0:
            raise skip_exception(check.unsupported_reason())
        if self.config.getoption("reproduce_failure", None):  # no example read the blob
            raise replayed_nothing(check.id or item.nodeid)
        return result

    @pytest.hookimpl(tryfirst=True)  # before junitxml's, which reads the properties
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Fold each phase's report into the check's outcome (the worst phase wins), and
        give ``--junitxml`` the outcome and finding (:mod:`harness.conformance.output.junit`)."""
        check = self.checks.get(report.nodeid)
        if check is None:
            return
        check.duration_s += report.duration
        self.triage.note_late(check, self.harness.take_late())
        outcome, message = classify_report(report)
        if outcome is not None:
            check.settle(outcome, message, failure_text(report))
            if report.failed and (pointer := self.triage.known_finding_line(check)):
                report.longrepr = pointer  # an earlier check's finding explains it: one line
        junit.annotate(report, check)
        if report.when == "teardown":
            self.triage.finished(check)
            self.items_done += 1
            self.progress.checks_done(self.items_done, self.items_total or len(self.checks))

    def _announce(self, finding: Finding, item: pytest.Item) -> None:
        """One terminal line the moment a finding is new (see
        :mod:`~harness.conformance.output.progress`)."""
        if finding.id in self.progress.announced:
            return
        check = self.checks.get(item.nodeid)
        listed = check is not None and check.id in self.expected
        message = finding.attribution.message
        where = finding.first_check
        if check is not None and not listed and finding.id in self.progress.expected:
            where = check.id  # first met in listed checks: this one is the news
        if self.progress.finding(finding.id, finding.clauses, message, where, listed):
            self.progress.reproduce(facts.reproducer(self.config, item.nodeid, ""))

    # -- the end --------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Build (and write) the report; under ``--conformance-strict`` fail a bad run."""
        if self.config.getoption("collectonly"):
            return
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        why = not_run_reason(interrupted, session.shouldstop or session.shouldfail)
        for check in self.checks.values():
            if check.outcome is None:
                check.settle(NOT_RUN, why)
        self.report = self.build_report()
        directory = self.config.getoption("conformance_report")
        if directory:
            write_report(self.report, directory)
        if self.config.getoption("conformance_strict"):
            whole = bool(self.config.getoption("require_whole_space"))
            self.strict = strict_verdict(self.report, whole)
            if not self.strict.passed and session.exitstatus == 0:  # no test case failed
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
                self.strict_alone = True
        late = [f for f in self.triage.findings if f.seen_late]
        unexpected = [f for f in late if not set(f.clauses) <= set(self.expected_late)]
        if unexpected and session.exitstatus == 0:  # a violation, though no check failed on it
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.triage.late_unmatched() and session.exitstatus == 0:  # an expected one went away
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """A run that only the strict verdict failed (no test case failed) gets a failed test
        case in the ``--junitxml`` file too (pytest wrote the file at the session's end), so
        the file and the exit status agree."""
        path = config.getoption("xmlpath", None)
        if self.strict is not None and self.strict_alone and path:
            add_to_junit(path, self.strict)

    def build_report(self) -> Report:
        """The report of this session, from the checks as they stand
        (:func:`~harness.conformance.output.report_data.build_report`)."""
        return report_data.build_report(
            self.config,
            list(self.checks.values()),
            self.triage,
            self.harness,
            selection={
                "clauses": self.config.getoption("clauses"),
                "deselected": list(self.deselected),
                "unmatched_patterns": sorted(set(self.patterns) - self.matched_patterns),
            },
            expected_failures={
                "file": self.expected_file,
                "listed": sorted(set(self.expected) & self.collected_ids),
                "unmatched": sorted(set(self.expected) - self.collected_ids)
                + self.triage.late_unmatched(),
                "late_findings_expected": sorted(self.expected_late),
            },
            started_at=self.started_at,
            wall_time_s=time.perf_counter() - self.started,
        )

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> Generator[None, None, None]:
        """The findings and clause summary (and the strict verdict) after pytest's failures and
        short test summary, then pytest's warnings, held back until after them."""
        held = terminalreporter.stats.pop("warnings", None)
        try:
            return (yield)
        finally:
            if self.report is not None and summary_wanted(self.config, self.checks.values()):
                write_summary(terminalreporter, self.config, self.report)
            if held:
                terminalreporter.stats["warnings"] = held + terminalreporter.stats.get(
                    "warnings", []
                )
                terminalreporter.summary_warnings()
