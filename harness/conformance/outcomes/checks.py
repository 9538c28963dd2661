"""Checks: their ids, their outcomes from pytest reports, and the expected-failures file.

A check id is ``<suite module>.<test>[<param id>]``: the module's dotted name from its
package root with a leading ``suites.`` dropped, then the test (``Class.test`` for methods) and
pytest's parameter id. It depends neither on the rootdir nor on the import mode.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.report import SEVERITY
from harness.report.model import FAILED_WITH, XPASS_PREFIX

__all__ = [
    "Check",
    "check_id",
    "classify_report",
    "classify_skip",
    "clauses_of",
    "collector_id",
    "failure_text",
    "family_of",
    "family_parameter",
    "load_expected_failures",
    "module_name",
    "not_run_reason",
    "world_sizes_of",
]

_MAX_SUMMARY = 4000
#: Hypothesis errors that mean the suite itself is broken (an Unsatisfiable that is not made of
#: recorded Unsupported examples: the suite's own filters rejected everything); a
#: ``--reproduce-failure`` that showed no failure (nothing the strategy did)
_SUITE_ERRORS = re.compile(
    r"^(hypothesis\.errors\.)?(FailedHealthCheck|InvalidArgument|Unsatisfiable)\b"
    r"|^(harness\.conformance\.outcomes\.replay\.)?NothingReplayed\b"
)
_XPASS_STRICT = "[XPASS(strict)]"
#: failures that are verdicts of their own kind: the exception names the outcome
_OWN_KINDS = {
    "desync": re.compile(r"^(harness\.verdicts\.failures\.)?CollectiveDesync\b"),
    "hang": re.compile(r"^(harness\.verdicts\.failures\.)?CollectiveHang\b"),
}


@dataclass
class Check:
    """One collected test and what became of it so far.

    Args:
        id: the check id.
        nodeid: pytest's node id (what a reproducer passes to pytest).
        clauses: the clause ids from the test's ``clause`` markers.
        world_sizes: the world sizes the test declares (its ``world_size`` marker), if any.
    """

    id: str
    nodeid: str
    clauses: list[str]
    world_sizes: list[int] = field(default_factory=list)
    outcome: str | None = None
    failure: str | None = None
    text: str = ""  # the full failure text, searched for Hypothesis' seed and blob
    duration_s: float = 0.0
    unsupported: list[str] = field(default_factory=list)
    examples_ran: int = 0
    family: str = ""
    family_parameter: str = ""  # its ``family`` parameter: every example builds that family
    finding: str = ""  # the finding its failure belongs to (failed, blocked)
    failed_clauses: list[str] = field(default_factory=list)  # what the failure broke
    blocked_by: str = ""  # the other clause whose violation kept it from its property
    late_findings: list[str] = field(default_factory=list)  # recorded after its property
    first_failure_at: float | None = None  # perf_counter of its first failing example
    stop_shrinking: bool = False  # its failure is known (or over budget): shrink no more
    rank_jobs: int = 0  # rank jobs its examples dispatched (shrinking included)
    remembered_in_a_row: int = 0  # examples refused alike (or from memory) in a row
    last_refusal: str = ""  # the description of the last refusal
    found_in: str = ""  # the check that found (and shrank) its finding first, when another
    draws_in_body: bool = False  # its Hypothesis test draws with st.data() in its body
    search_ended: bool = False  # its shrink budget ended Hypothesis' search (not Hypothesis)
    exercised: list[dict[str, tuple[str, ...]]] = field(default_factory=list)  # axis values run
    params: dict[str, str] = field(default_factory=dict)  # its parameters, repr'd (the example)
    # Hypothesis' several distinct failures, listed (:mod:`.distinct`), and the first one's
    # notes (failing example, @reproduce_failure); "" for a single failure
    distinct: str = ""
    distinct_notes: str = ""
    # the verdict of its own kind those failures read (:mod:`.several`), or ""
    several_verdict: str = ""

    def record_unsupported(self, description: str) -> None:
        """Remember one ``unsupported: ...`` description (each distinct one once)."""
        if description not in self.unsupported:
            self.unsupported.append(description)

    def unsupported_reason(self) -> str:
        """The skip reason when no example could run: the first description, then the rest."""
        first, rest = self.unsupported[0], self.unsupported[1:]
        if not rest:
            return first
        others = "; ".join(d.removeprefix("unsupported: ") for d in rest[:3])
        more = f" (+{len(rest) - 3} more)" if len(rest) > 3 else ""
        return f"{first}; also {others}{more}"

    def settle(self, outcome: str, message: str | None, text: str = "") -> None:
        """Take ``outcome`` if it is worse than the current one (phases: the worst wins).

        A failure attributed to a clause the check does not declare makes it ``blocked``;
        Hypothesis' several distinct failures are each listed (:attr:`distinct`).
        """
        if outcome == "failed" and self.several_verdict:
            outcome = self.several_verdict  # several failures, one a desync or hang
        if self.distinct and outcome in ("failed", "blocked", "desync", "hang"):
            message = self.distinct if message is None else _with_listing(message, self.distinct)
            text = f"{self.distinct_notes}\n{text}"  # the finding's example and replay: the first's
        if outcome == "failed" and self.blocked_by:
            outcome = "blocked"
            message = f"blocked by {self.blocked_by} ({self.finding}): {message}"
        if outcome in ("failed", "blocked") and self.found_in:
            message = f"{message}\n(finding {self.finding}, not shrunk again: see {self.found_in})"
        if self.outcome is None or SEVERITY.index(outcome) < SEVERITY.index(self.outcome):
            self.outcome, self.failure, self.text = outcome, message, text


def _with_listing(message: str, listing: str) -> str:
    """The message with pytest's one-line summary of an exception group (``ExceptionGroup:
    Hypothesis found 2 distinct failures. (2 sub-exceptions)``) told as the listing."""
    first, _, rest = message.partition("\n")
    if "distinct failures" in first:
        return f"{listing}\n{rest}".rstrip()
    return f"{message}\n{listing}"


@functools.lru_cache(maxsize=1024)
def module_name(path: Path) -> str:
    """The dotted module name of a test file, without a leading ``suites.``."""
    parts = [path.stem if path.suffix == ".py" else path.name]
    parent = path.parent
    while (parent / "__init__.py").is_file() and parent != parent.parent:
        parts.insert(0, parent.name)
        parent = parent.parent
    if len(parts) > 1 and parts[0] == "suites":
        parts = parts[1:]
    return ".".join(parts)


def _join_id(module: str, rest: str) -> str:
    return f"{module}.{rest.replace('::', '.')}" if rest else module


def check_id(item: pytest.Item) -> str:
    """The check id of a test item, e.g. ``test_training.test_parity[ws2]``."""
    _, _, rest = item.nodeid.partition("::")
    return _join_id(module_name(Path(item.path)), rest)


def collector_id(rootpath: Path, nodeid: str) -> str:
    """The check id standing for a collector (a module that failed to import or skipped)."""
    path, _, rest = nodeid.partition("::")
    return _join_id(module_name(rootpath / path), rest)


def _clip(text: str) -> str:
    # keep the head (the error) and the tail (Hypothesis' falsifying example and blob)
    text = text.strip()
    if len(text) <= _MAX_SUMMARY:
        return text
    head, tail = _MAX_SUMMARY * 5 // 8, _MAX_SUMMARY * 3 // 8
    cut = len(text) - head - tail
    return f"{text[:head]}\n... ({cut} characters cut) ...\n{text[-tail:]}"


def _summary(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    return _clip(message or report.longreprtext or "(no message)")


def failure_text(report: Any) -> str:
    """Everything pytest has on a report: the long repr and the captured sections."""
    sections = "\n".join(content for _, content in getattr(report, "sections", []))
    return f"{report.longreprtext}\n{sections}"


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(reason).removeprefix("Skipped: ").strip()


def classify_skip(reason: str) -> tuple[str, str]:
    """Map a skip reason to ``unsupported``/``environment``; any other skip is an ``error``."""
    lowered = reason.lower()
    if lowered.startswith("unsupported:"):
        return "unsupported", reason
    if lowered.startswith("environment:"):
        return "environment", reason
    return "error", (
        "skipped without a classified reason (a suite's skip must start with "
        f"'unsupported:' or 'environment:'): {reason}"
    )


def classify_report(report: Any) -> tuple[str | None, str | None]:
    """The outcome (and why) one phase report implies; ``(None, None)`` for a passed phase.

    Args:
        report: a ``TestReport`` (setup, call or teardown) or a ``CollectReport``.
    """
    when = getattr(report, "when", "collect")
    if report.passed:
        return ("passed", None) if when == "call" else (None, None)
    if report.skipped:
        if hasattr(report, "wasxfail"):
            return "xfailed", f"{report.wasxfail}{FAILED_WITH}{_summary(report)}"
        return classify_skip(_skip_reason(report))
    summary = _summary(report)
    if when != "call":
        return "error", f"{when} failed: {summary}"
    if summary.startswith(_XPASS_STRICT):
        reason = summary.removeprefix(_XPASS_STRICT).strip()
        return "failed", f"{XPASS_PREFIX} (strict xpass): {reason}"
    if _SUITE_ERRORS.match(summary):
        return "error", summary
    kind = next((k for k, pattern in _OWN_KINDS.items() if pattern.match(summary)), "failed")
    return kind, summary


def not_run_reason(interrupted: bool, stopped: str | bool) -> str:
    """Why a check the session never reached did not run (its ``not run`` outcome's text).

    Args:
        interrupted: the run was interrupted (Ctrl-C, SIGTERM).
        stopped: ``session.shouldstop or session.shouldfail``: the reason the session gave
            for stopping early (``-x``, ``--maxfail``, a lost rank), or False. It wins over
            ``interrupted``: pytest reports a session stopped that way (attach mode's lost
            rank) as interrupted too, and the reason is the better story.
    """
    if isinstance(stopped, str) and stopped:
        return f"the session stopped before this check: {stopped}"
    if interrupted:
        return "the run was interrupted (Ctrl-C or SIGTERM) before this check finished"
    return "the session stopped before this check (-x, --maxfail or a crash)"


def load_expected_failures(path: str | None) -> dict[str, str]:
    """Read ``--expected-failures``: ``CHECK_ID  reason`` lines, ``#`` comments, blank lines.

    Raises:
        pytest.UsageError: the file is missing or lists a check id twice.
    """
    if path is None:
        return {}
    file = Path(path)
    if not file.is_file():
        raise pytest.UsageError(
            f"--expected-failures={path!r} is not a file; pass a text file with one "
            "'CHECK_ID  reason' line per expected failure."
        )
    entries: dict[str, str] = {}
    for lineno, line in enumerate(file.read_text().splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        check, *reason = text.split(maxsplit=1)
        if check in entries:
            raise pytest.UsageError(
                f"--expected-failures={path!r}, line {lineno}: check {check!r} is listed twice; "
                "keep one line per check."
            )
        entries[check] = reason[0].strip() if reason else "listed in the expected-failures file"
    return entries


_FAMILY_WORDS = {"fsdp": "fsdp", "model_parallel": "model_parallel", "fsdp2": "fsdp2"}


def clauses_of(item: pytest.Item) -> list[str]:
    """The clause ids a test declares with ``@pytest.mark.clause`` (sorted, each once)."""
    clauses: set[str] = set()
    for marker in item.iter_markers("clause"):
        for arg in marker.args:
            if not isinstance(arg, str) or not arg.strip():
                raise pytest.UsageError(
                    f"{item.nodeid}: @pytest.mark.clause({arg!r}) is not a clause id; "
                    "pass CONTRACT.md ids as strings, e.g. @pytest.mark.clause('CKPT-RT-3')."
                )
            clauses.add(arg.strip())
    return sorted(clauses)


def family_parameter(item: pytest.Item) -> str:
    """The check's ``family`` parameter (``@pytest.mark.parametrize("family", ...)``), or
    ``""``: unlike :func:`family_of`'s guesses, a family every example of the check builds."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    family = params.get("family")
    return family if isinstance(family, str) and family in _FAMILY_WORDS else ""


def family_of(item: pytest.Item, clauses: list[str]) -> str:
    """The family a check is about: its ``family`` parameter, a family word in its parameter
    id, or its clauses' prefix (``MP-``: model_parallel, ``FSDP2-``: fsdp2); ``""`` for a
    check of several."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if params.get("family") in _FAMILY_WORDS:
        return str(params["family"])
    words = re.split(r"[\[\]\-_.]", item.nodeid.partition("[")[2])
    joined = item.nodeid.partition("[")[2]
    if "model_parallel" in joined:
        return "model_parallel"
    for word in ("fsdp2", "fsdp"):  # a row id or parameter id that starts with its family
        if word in words:
            return word
    if clauses and all(c.startswith("MP-") for c in clauses):
        return "model_parallel"
    if clauses and all(c.startswith("FSDP2-") for c in clauses):
        return "fsdp2"
    return ""


def world_sizes_of(item: pytest.Item) -> list[int]:
    """The world sizes a test runs at: its ``world_size`` parameter or marker."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if isinstance(params.get("world_size"), int):
        return [params["world_size"]]
    marker = item.get_closest_marker("world_size")
    if marker is None:
        return []
    values = [*marker.args, *marker.kwargs.values()]
    flat = [v for x in values for v in (x if isinstance(x, (list, tuple)) else [x])]
    return sorted({v for v in flat if isinstance(v, int) and not isinstance(v, bool)})
