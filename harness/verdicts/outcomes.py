"""What happened on each rank during one job, and the error that tells every rank's story.

A job ends on every rank with exactly one :class:`Outcome`: ``ok`` (the value came back),
``raised`` (the rank function raised; the remote traceback is kept), ``crashed`` (the rank
process died: exit code or signal) or ``hung`` (the rank was still running when the deadline
passed, or some seconds after another rank failed; its Python stacks are kept). Any outcome
other than ``ok`` makes ``run_on_ranks`` raise :class:`RankFailure`, whose message lists the
ranks first failure first.
"""

from __future__ import annotations

import pickle
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from harness.verdicts.attribution import tag
from harness.verdicts.collectives import Collective
from harness.wire.protocol import ErrorReport, Kind, Result, Usage

if TYPE_CHECKING:
    from harness.wire.protocol import Reply

__all__ = [
    "BUDGET_DETAIL",
    "STUCK_DETAIL",
    "Outcome",
    "OutcomeKind",
    "RankFailure",
    "RemoteError",
    "fatal_dump",
    "format_story",
    "normalize_per_rank",
    "outcome_from_error",
    "outcome_from_reply",
    "outcome_from_result",
    "tidy_stacks",
]

OutcomeKind = Literal["ok", "raised", "crashed", "hung"]
#: how the ``detail`` of a rank cut off by its test's time budget begins (see
#: :mod:`harness.run.budget`): the hang verdict then says so in its first line
BUDGET_DETAIL = "still running when the test's time ran out"
#: how the ``detail`` of ranks that all sat in collectives without moving begins
#: (:mod:`harness.pool.stall`)
STUCK_DETAIL = "stuck in a collective"
_TAIL_LINES = 20


@dataclass
class RemoteError:
    """An exception raised on a rank, as the controller sees it.

    Args:
        type_name: qualified name of the exception class (``module.Class``).
        message: ``str(exc)``.
        traceback: the formatted remote traceback (frames of the harness removed).
        exception: the exception object, when it survived pickling; else ``None``.
        is_distributed: whether it came from torch.distributed (a collective or the store
            failed), which means the process group can no longer be trusted.
        clause: the clause the rank attributed it to (``harness.clause``), or ``""``.
    """

    type_name: str
    message: str
    traceback: str
    exception: BaseException | None = None
    is_distributed: bool = False
    clause: str = ""


@dataclass
class Outcome:
    """One rank's result of one job.

    Args:
        rank: the rank.
        kind: ``ok``, ``raised``, ``crashed`` or ``hung``.
        value: the returned value (``ok`` only).
        error: the remote exception (``raised`` only).
        exitcode: the process exit code, negative for a signal (``crashed`` only).
        stacks: Python stacks of the rank's threads (``hung``; for ``crashed`` the fatal
            error dump when there was one).
        detail: one line on why the outcome was decided (``hung``: which deadline).
        elapsed: seconds from dispatch until the outcome was known.
        stdout: what the rank wrote to stdout during the job.
        stderr: what the rank wrote to stderr during the job.
        warnings: warnings the rank emitted during the job, formatted.
        collective: the collective the rank entered when the ranks' collectives did not
            match (``raised``), or the one it waits in (``hung``), when known.
        warning_records: the warnings as ``(category, message, filename, lineno)``.
        collective_error: the first error a c10d collective raised in the job, also one
            the job caught and went on from.
        trace: the rank's last collectives from NCCL's flight recorder, oldest first.
        late: violations the job recorded after its property was tested (``ok`` only; see
            [Note: clause isolation] in :mod:`harness.verdicts.attribution`).
        usage: what the rank held after the job (``ok`` and ``raised``; see [Note: bounded
            ranks] in :mod:`harness.rank.usage`).
    """

    rank: int
    kind: OutcomeKind
    value: Any = None
    error: RemoteError | None = None
    exitcode: int | None = None
    stacks: str = ""
    detail: str = ""
    elapsed: float = 0.0
    stdout: str = ""
    stderr: str = ""
    warnings: str = ""
    collective: Collective | None = None
    warning_records: tuple[tuple[str, str, str, int], ...] = ()
    collective_error: str = ""
    trace: str = ""
    late: tuple[Any, ...] = ()
    usage: Usage | None = None

    @property
    def ok(self) -> bool:
        """Whether the rank returned a value."""
        return self.kind == "ok"

    @property
    def signal_name(self) -> str | None:
        """Name of the signal that killed the rank (``SIGSEGV``), if one did."""
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def exception(self) -> BaseException | None:
        """The remote exception object, when the rank raised one that could be pickled."""
        return self.error.exception if self.error else None

    def headline(self) -> str:
        """One line: what happened on this rank."""
        when = f" after {self.elapsed:.2f} s"
        if self.kind == "ok":
            return f"rank {self.rank} ok{when}"
        if self.kind == "raised":
            assert self.error is not None
            first = self.error.message.strip().splitlines()[:1]
            msg = f": {first[0]}" if first else ""
            return f"rank {self.rank} raised {self.error.type_name}{msg}{when}"
        if self.kind == "crashed":
            if self.exitcode is None and self.detail:
                return f"rank {self.rank} crashed: {self.detail}"
            if self.signal_name is not None:
                how = f"killed by {self.signal_name} (exit code {self.exitcode})"
            else:
                how = f"process exited with code {self.exitcode}"
            return f"rank {self.rank} crashed: {how}{when}"
        waits = f"; waits in {self.collective.describe()}" if self.collective else ""
        return f"rank {self.rank} hung: {self.detail}{waits}"

    def story(self) -> str:
        """The headline followed by the traceback, stacks and stderr tail that explain it."""
        return "\n".join(p for p in (self.headline(), self.explanation()) if p)

    def explanation(self) -> str:
        """The traceback, stacks and stderr tail that explain the headline, indented (``""``
        when there are none)."""
        parts = []
        if self.error is not None:
            parts.append(_indent(self.error.traceback))
        if self.stacks:
            label = "Python stacks" if self.kind == "hung" else "fatal error dump"
            if self.kind == "crashed" and "most recent call first" not in self.stacks:
                label += (
                    " (no Python frame in it: the crashing thread ran no Python code, such as"
                    " a native library's own thread, or the rank died while writing it)"
                )
            parts.append(_indent(f"{label}:\n{self.stacks}"))
        if self.trace:
            parts.append(_indent(f"NCCL flight recorder (last collectives):\n{self.trace}"))
        if self.kind in ("crashed", "hung") and self.stderr.strip():
            tail = "\n".join(self.stderr.rstrip().splitlines()[-_TAIL_LINES:])
            parts.append(_indent(f"stderr (last lines):\n{tail}"))
        return "\n".join(p.rstrip() for p in parts if p.strip())


#: what differs between ranks that failed the same way: rank numbers, process ids, object
#: and thread addresses, hosts and ports, temporary names (line numbers and values stay: they
#: tell bugs apart)
_PER_RANK = (
    (re.compile(r"\b((?:local_|global_)?ranks?[ _=:#-]?)\d+", re.I), r"\1<N>"),
    (re.compile(r"\b(pid[ =:]?|process |worker )\d+", re.I), r"\1<PID>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<ADDR>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<HOST>"),
    (re.compile(r"\b(localhost|\[::1?\]):\d+\b"), r"\1:<PORT>"),
    (re.compile(r"\btmp[a-z0-9_]{8}\b"), "tmp<RANDOM>"),  # tempfile's names
)


def normalize_per_rank(text: str) -> str:
    """``text`` with rank numbers, pids, addresses and ports replaced by placeholders, so
    that two ranks' tracebacks compare equal when only those differ."""
    for pattern, placeholder in _PER_RANK:
        text = pattern.sub(placeholder, text)
    return text


def rank_range(ranks: Sequence[int]) -> str:
    """``ranks 0-3``, ``ranks 0, 2, 5-7``, ``rank 4``: sorted, runs of three or more joined."""
    values = sorted(set(ranks))
    runs: list[list[int]] = []
    for r in values:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = []
    for run in runs:
        if len(run) >= 3:
            parts.append(f"{run[0]}-{run[-1]}")
        else:
            parts.extend(map(str, run))
    return ("ranks " if len(values) > 1 else "rank ") + ", ".join(parts)


_SAME = {"raised": "same traceback", "hung": "same stacks", "crashed": "same crash report"}


_WATCHDOG = re.compile(
    r'harness[/\\](?:rank[/\\]worker\.py", line \d+ in (?:watch|dump_stacks)'
    r'|rank[/\\]attached\.py", line \d+ in _watch'
    r'|attach[/\\]__main__\.py", line \d+ in _watch_controller)$',
    re.M,
)
#: the harness frame that calls the rank function (``JobRunner``'s ``_call``): what is below
#: it in a dump (the runner, the worker loop, multiprocessing's bootstrap) explains nothing
_HARNESS_CALL = re.compile(r'harness[/\\]rank[/\\]runner\.py", line \d+ in _call$')


_FATAL = "Fatal Python error:"


def fatal_dump(text: str) -> str:
    """The fatal-error part of what a crashed rank's stack file gained during the job: from
    its last ``Fatal Python error:`` on. The stall probe's samples taken before the crash
    come earlier in the same file and would read as the crash's stack; a rank killed by a
    signal ``faulthandler`` does not catch (``SIGKILL``) leaves no such line, and then the
    last sample is all there is."""
    start = text.rfind(_FATAL)
    return text[start:] if start >= 0 else text


def tidy_stacks(text: str) -> str:
    """Keep what explains a rank: drop the harness watchdog thread and the frames below the
    rank function (the worker loop, multiprocessing's bootstrap) from a faulthandler dump."""
    blocks = []
    for block in text.strip().split("\n\n") if text.strip() else []:
        if _WATCHDOG.search(block) or block.startswith("Extension modules:"):
            continue
        lines = []
        for line in block.splitlines():
            if _HARNESS_CALL.search(line):
                break
            lines.append(line)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + ("\n" if blocks else "")


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line else line for line in text.rstrip().splitlines())


def _failure_order(outcome: Outcome) -> tuple[int, float, int]:
    return (outcome.ok, outcome.elapsed, outcome.rank)


def format_story(outcomes: Sequence[Outcome], what: str) -> str:
    """Every rank's story for the message of :class:`RankFailure`, first failure first.

    Args:
        outcomes: one outcome per rank, index = rank.
        what: the job, as the first line names it (function, world size, job id).
    """
    ordered = sorted(outcomes, key=_failure_order)
    failed = [o for o in ordered if not o.ok]
    summary = ", ".join(f"rank {o.rank} {o.kind}" for o in failed)
    n_ok = len(outcomes) - len(failed)
    lines = [f"{what}: {summary}; {n_ok} of {len(outcomes)} ranks ok (first failure first)"]
    lines.extend(_grouped_stories(ordered))
    return "\n".join(lines)


def _grouped_stories(ordered: Sequence[Outcome]) -> list[str]:
    """Each rank's headline; each distinct explanation once. Ranks whose explanations are
    equal once :func:`normalize_per_rank` has run (the same traceback on every rank, say)
    are listed together, first failure first, under one "ranks 0-3: same traceback" line
    and the first one's explanation."""
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for o in ordered:
        text = o.explanation()
        key = (o.kind, normalize_per_rank(text)) if text else ("", f"alone {o.rank}")
        groups.setdefault(key, []).append(o)
    out = []
    for members in groups.values():
        first = members[0]
        if len(members) == 1:
            out.append(first.story())
            continue
        out.extend(o.headline() for o in members)
        same = _SAME.get(first.kind, "same report")
        out.append(f"{rank_range([o.rank for o in members])}: {same} (rank {first.rank}'s)")
        out.append(first.explanation())
    return out


class RankFailure(Exception):
    """A job failed on at least one rank; ``outcomes`` holds every rank's :class:`Outcome`.

    Args:
        message: every rank's story (see :func:`format_story`).
        outcomes: one outcome per rank, index = rank.
    """

    def __init__(self, message: str, outcomes: Sequence[Outcome]) -> None:
        super().__init__(message)
        self.outcomes = list(outcomes)
        clause = self.clause
        if clause:
            tag(self, clause)

    @property
    def clause(self) -> str:
        """The clause the first failing rank attributed its error to (``""`` if none)."""
        failing = [o for o in sorted(self.outcomes, key=_failure_order) if not o.ok]
        errors = [o.error for o in failing if o.error is not None]
        own = [e for e in errors if not e.is_distributed] or errors
        return own[0].clause if own else ""

    @property
    def failed_ranks(self) -> list[int]:
        """Ranks whose outcome is not ``ok``, first failure first."""
        return [o.rank for o in sorted(self.outcomes, key=_failure_order) if not o.ok]

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.outcomes))


def outcome_from_error(rank: int, report: ErrorReport, elapsed: float) -> Outcome:
    """The ``raised`` outcome for a rank's error event (the exception unpickled if it can be)."""
    exception = None
    if report.exception is not None:
        try:
            exception = pickle.loads(report.exception)
        except Exception:
            exception = None
    error = RemoteError(
        report.type_name,
        report.message,
        report.traceback,
        exception,
        report.is_distributed,
        report.clause,
    )
    outcome = Outcome(rank, "raised", error=error, elapsed=elapsed, warnings=report.warnings)
    outcome.collective = report.desync
    outcome.warning_records = report.warning_records
    outcome.collective_error = report.collective_error
    return outcome


def outcome_from_result(rank: int, result: Result, elapsed: float) -> Outcome:
    """The ``ok`` outcome for a rank's result event (``raised`` if it cannot be unpickled)."""
    try:
        value = pickle.loads(result.value)
    except Exception as exc:
        message = f"the controller could not unpickle rank {rank}'s return value: {exc}"
        error = RemoteError(type(exc).__qualname__, message, "", None)
        outcome = Outcome(rank, "raised", error=error, elapsed=elapsed, warnings=result.warnings)
    else:
        outcome = Outcome(rank, "ok", value=value, elapsed=elapsed, warnings=result.warnings)
    outcome.warning_records = result.warning_records
    outcome.collective_error = result.collective_error
    outcome.late = result.late
    return outcome


def outcome_from_reply(reply: Reply, kinds: tuple[str, ...], elapsed: float) -> Outcome | None:
    """The outcome a rank's reply tells: an error, a result, another of ``kinds`` (``ok``
    with its payload), or a crash; ``None`` for an event of another kind (a late reply)."""
    event = reply.event
    if event is None:
        outcome = Outcome(
            reply.rank,
            "crashed",
            exitcode=reply.exitcode,
            detail=reply.detail,
            elapsed=elapsed,
            stacks=tidy_stacks(fatal_dump(reply.stacks)),
        )
    elif event.kind == Kind.ERROR:
        outcome = outcome_from_error(reply.rank, event.payload, elapsed)
    elif event.kind not in kinds:
        return None
    elif event.kind == Kind.RESULT:
        outcome = outcome_from_result(reply.rank, event.payload, elapsed)
    else:
        outcome = Outcome(reply.rank, "ok", value=event.payload, elapsed=elapsed)
    outcome.stdout, outcome.stderr = reply.stdout, reply.stderr
    if event is not None:
        outcome.usage = event.usage
    return outcome
