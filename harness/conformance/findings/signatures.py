"""Signatures: what one failing check's failure is, for grouping into findings.

A *signature* names a root cause: the clause the failure is attributed to, the exception's
type, its message with numbers, shapes, device meshes, paths and addresses masked, and the
innermost frame outside shardcheck (the strategy's or torch's code where it was raised). For an
assertion made by a suite (its innermost frame is shardcheck's own) the location is left out:
the clause and the assertion's words name it. :mod:`harness.conformance.findings.grouping` groups
failures by it.

[Note: clause isolation] (in :mod:`harness.verdicts.attribution`) says how a failure gets its
clause.
"""

from __future__ import annotations

import re
import sysconfig
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

from harness.conformance.findings.checked_headline import told_after_right_file
from harness.conformance.findings.crash_site import OWN_DIRS, clause_at_crash, crashed_inside
from harness.hypothesis_compat import is_wrapped_base_exception
from harness.report.words import shorten
from harness.verdicts.attribution import (
    ROUND_TRIP_CLAUSES,
    TRAINING_METHODS,
    LateViolation,
    clause_of,
    looked_through,
)
from harness.verdicts.checked_file import checked_file_of
from harness.verdicts.outcomes import RankFailure

__all__ = [
    "Attribution",
    "attribute",
    "difference",
    "distinct_failures",
    "headline",
    "is_failure",
    "late_attribution",
    "mask",
    "named_clause",
]

_ROOT = Path(__file__).resolve().parents[3]
#: frames in these directories are shardcheck's own (not where a strategy's bug lives)
_LIBRARY_PARTS = ("/_pytest/", "/pluggy/", "/hypothesis/", "/contextlib.py")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)', re.M)
#: terminal colour codes some libraries put in their messages (torch's weights-only error)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MASKS = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    # random parts of names: one leftover file is one finding whichever name it drew
    (re.compile(r"\b[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}\b"), "UUID"),
    (
        re.compile(r"(?<=[A-Za-z][-_.])(?:[0-9a-f]{8}|[0-9a-f]{32}|(?=[0-9a-f]*\d)[0-9a-f]{6,})\b"),
        "HEX",
    ),
    (re.compile(r"\btmp[a-z0-9_]{8}\b"), "TMPDIR"),
    # counters glued to words (torch's collective fingerprints: "SequenceNumber=30OpType")
    (re.compile(r"(?<==)\d+(?=[A-Za-z])|\b\d+(?=vs\b)"), "N"),
    # a device mesh's printed shape and names: "meshes differ" is one error whichever meshes
    (re.compile(r"DeviceMesh\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)"), "MESH"),
    (re.compile(r"(?:/[\w.@+-]+){2,}/?"), "PATH"),
    # a precision and its dtypes: the same raise (or wrong answer) under bf16-mixed and
    # 16-mixed is one finding ("a gradient with dtype BFloat16" / "... Half")
    (re.compile(r"\b(?:bf)?(?:16|32|64)-(?:mixed|true)\b"), "PRECISION"),
    (re.compile(r"\btorch\.(?:b?float(?:16|32|64)|half|float|double)\b"), "DTYPE"),
    (re.compile(r"\b(?:BFloat16|Half|Float|Double)\b"), "DTYPE"),
    # a comparison's tolerance and its reason (suites' assert_close): the same wrong value is
    # one finding whichever precision's tolerance it went past
    (re.compile(r"\(rtol=.*$"), "(TOLERANCE)"),
    (re.compile(r"torch\.Size\(\[[^\]]*\]\)"), "SHAPE"),
    (re.compile(r"\[[\d,\s]+\]"), "SHAPE"),
    # a list of three names or more (parameters, keys): the same wrong answer whichever
    # model showed it (shorter lists are what is wrong: a leftover file, a missing key)
    (re.compile(r"\[(?:'[^']*', ){2,}'[^']*'\]"), "[NAMES]"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?!\w)"), "N"),
)
_KEY_CHARS = 160
_STDLIB = sysconfig.get_paths()["stdlib"]
#: a desync verdict's line for one rank's collective (harness.verdicts.failures)
_ENTERED = re.compile(r"entered \w+\b.*? at (?P<file>/\S+):(?P<line>\d+) in (?P<func>\S+)")
#: the first line of a suite's report of a rank's exception: ``rank 0: ValueError: ...``
_RANK_ERROR = re.compile(
    r"^rank \d+: ((?:[\w]+\.)*[A-Z]\w*(?:Error|Exception|Warning)?): (.*)$", re.M
)
#: a suite's report of a nested value that differs, after the words that say where:
#: ``... loaded at world size 2 (fsdp): optimizer['state']['fc.bias']['exp_avg']: 3 of 4 ...``
_NESTED = re.compile(r"(?<![\w\]])(\w+)((?:\[[^\[\]]*\])+): (.+)$")
_SUBSCRIPT = re.compile(r"\[[^\[\]]*\]")
#: a list of quoted names, of any length: ``['exp_avg', 'step']``, ``['momentum_buffer']``
_QUOTED_NAMES = re.compile(r"\[(?:'[^']*', )*'[^']*'\]")
#: a suite's assertion message that starts with the clause it checks: ``"CKPT-RT-1: ..."``
_NAMED_CLAUSE = re.compile(r"^\s*(?:rank \d+: )?([A-Z]+(?:-[A-Z]+)*-\d+):")


def mask(message: str) -> str:
    """The first line of ``message`` with addresses, paths, shapes, device meshes and numbers
    masked."""
    first = _first(message)
    for pattern, replacement in _MASKS:
        first = pattern.sub(replacement, first)
    return shorten(first, _KEY_CHARS, mark="")


@dataclass(frozen=True)
class Attribution:
    """What one failing check's failure is, for grouping and reporting.

    Args:
        clause: the clause the failure was attributed to (``harness.clause``), or ``""``.
        kind: ``raised``, ``crashed`` or ``hung`` (a rank's outcome), or ``assertion`` (a
            suite's comparison failed in the controller).
        type_name: the exception type.
        key: the masked message.
        where: ``file:line function`` of the innermost frame outside shardcheck, or of the
            assertion.
        message: the unmasked first line (for the report).
        through: the clauses whose methods the failing code looked through
            (``harness.looking``; [Note: looking through]).
        difference: for a suite's assertion that a nested value differs, that difference
            alone (``optimizer['state'][…]: N of N elements differ from what was saved``):
            the same wrong value whichever check, family, format or rank met it.
        method: the strategy method a suite called that the exception came out of
            (``load_checkpoint``), or ``""``: an untagged failure is that method's clause's
            (:func:`harness.verdicts.attribution.method_clause`).
        raised_in: for an exception raised in torch's code (a desync caught in c10d, a shape
            error in an op) called from the strategy's, torch's innermost frame; ``where``
            is then the strategy's own line that called into torch. ``""`` otherwise.
    """

    clause: str
    kind: str
    type_name: str
    key: str
    where: str
    message: str
    through: tuple[str, ...] = ()
    difference: str = ""
    method: str = ""
    raised_in: str = ""

    @property
    def place(self) -> str:
        """Type, masked message and location, without the clause: the same error raised at
        the same place in the strategy (not for a suite's assertion, whose words are all)."""
        if self.kind == "assertion":
            return ""
        return f"{self.type_name}: {self.key} @ {_strip_line(self.where)}"

    def signature(self, clauses: list[str]) -> str:
        """The grouping key, for a failure of a check declaring ``clauses``."""
        named = self.clause or ",".join(clauses)
        place = "" if self.kind == "assertion" else f" @ {_strip_line(self.where)}"
        return f"{named}: {self.type_name}: {self.difference or self.key}{place}"

    @property
    def same_difference(self) -> str:
        """The key of a suite's report of a wrong nested value, without the clause: one wrong
        value met by checks of several clauses (a load that drops the optimizer state fails
        every round trip alike), or ``""``."""
        return f"{self.type_name}: {self.difference}" if self.difference else ""


def difference(first_line: str) -> str:
    """The masked nested difference a suite's assertion reports, without the words before it
    that say where it was seen; deeper keys than the first are folded (``[…]``); or ``""``."""
    match = _NESTED.search(first_line)
    if match is None:
        return ""
    subscripts = _SUBSCRIPT.findall(match.group(2))
    deeper = "[…]" if len(subscripts) > 1 else ""
    # the entry names what is wrong: a list after it is what an entry holds (Adam's moments,
    # SGD's momentum buffer), one finding whichever optimizer showed it
    what = _QUOTED_NAMES.sub("[NAMES]", match.group(3))
    return mask(f"{match.group(1)}{subscripts[0]}{deeper}: {what}")


def _strip_line(where: str) -> str:
    # same function in the same file: the same place, even when a line moved
    file, _, rest = where.partition(":")
    return f"{file}:{rest.partition(' ')[2]}" if rest else where


def _own(path: str) -> bool:
    return path.startswith(OWN_DIRS) or any(part in path for part in _LIBRARY_PARTS)


def _short_path(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(_ROOT))
    except ValueError:
        marker = "site-packages/"
        return path.split(marker, 1)[1] if marker in path else path


def _where_in_text(text: str) -> tuple[str, bool]:
    """The innermost frame outside shardcheck in a formatted traceback; else the innermost."""
    frames = [(m["file"], m["line"], m["func"]) for m in _FRAME.finditer(text)]
    if not frames:
        return "", False
    outside = [f for f in frames if not _own(f[0])]
    file, line, func = (outside or frames)[-1]
    return f"{_short_path(file)}:{line} {func}", bool(outside)


#: torch's own code (the package and its companions), wherever it is installed
_TORCH = re.compile(r"[/\\](?:torch|functorch|torchgen)[/\\]")


def _in_torch(path: str) -> bool:
    return bool(_TORCH.search(path)) and _installed(path)


def _caller_of_torch(text: str) -> tuple[str, str]:
    """For a traceback whose innermost frame outside shardcheck is torch's: ``(the innermost
    frame outside shardcheck, torch and Python's own library, as a location; torch's
    frame)``, the strategy's line that called into torch and where torch raised; ``("",
    "")`` when the exception was not raised in torch or no such caller is on the stack (a
    suite that called torch itself)."""
    frames = [(m["file"], m["line"], m["func"]) for m in _FRAME.finditer(text)]
    outside = [f for f in frames if not _own(f[0])]
    if not outside or not _in_torch(outside[-1][0]):
        return "", ""
    callers = [f for f in outside if not _in_torch(f[0]) and not f[0].startswith(_STDLIB)]
    if not callers:
        return "", ""
    file, line, func = callers[-1]
    torch_file, torch_line, torch_func = outside[-1]
    return (
        f"{_short_path(file)}:{line} {func}",
        f"{_short_path(torch_file)}:{torch_line} {torch_func}",
    )


def _strategy_site(attribution: Attribution, text: str) -> Attribution:
    """``attribution`` whose ``where`` is the strategy's line that called into torch when
    the exception was raised in torch's code, torch's frame kept as ``raised_in``."""
    caller, raised_in = _caller_of_torch(text)
    if not caller:
        return attribution
    return replace(attribution, where=caller, raised_in=raised_in)


def _collective_site(story: str) -> tuple[str, bool] | None:
    """The first collective of a desync story entered outside shardcheck (``rank 0 entered
    BARRIER at FILE:LINE in FUNC``), as a location: where the ranks went apart."""
    for match in _ENTERED.finditer(story):
        if not _own(match["file"]):
            return f"{_short_path(match['file'])}:{match['line']} {match['func']}", True
    return None


def _tb_text(tb: TracebackType | None) -> str:
    return "".join(traceback.format_tb(tb)) if tb is not None else ""


def _leaves(exc: BaseException, flaky: bool = False) -> list[tuple[BaseException, bool]]:
    """The exceptions an exception group holds, depth first (``[exc]`` for one exception),
    each with whether it came inside a flaky failure (a failure Hypothesis could not replay);
    an exception Hypothesis wrapped (a ``BaseException`` such as pytest-timeout's) unwrapped."""
    from hypothesis.errors import Flaky

    flaky = flaky or isinstance(exc, Flaky)
    inner = getattr(exc, "exceptions", None)
    if isinstance(inner, tuple) and inner:
        subs = [sub for sub in inner if isinstance(sub, BaseException)]
        return [leaf for sub in subs for leaf in _leaves(sub, flaky)]
    if is_wrapped_base_exception(exc) and exc.__cause__ is not None:
        exc = exc.__cause__
    return [(exc, flaky)]


def _candidates(exc: BaseException) -> list[BaseException]:
    """Of Hypothesis' several distinct failures, those that are the strategy's (not one inside
    a flaky failure, whose example passed when replayed, nor a test timeout), in order; all of
    them when none is."""
    leaves = _leaves(exc)
    steady = [leaf for leaf, flaky in leaves if not flaky and not _is_timeout(leaf)]
    return steady or [leaf for leaf, _ in leaves]


def _is_timeout(exc: BaseException) -> bool:
    return "Timeout (>" in str(exc) and "pytest-timeout" in str(exc)


def _type_name(cls: type) -> str:
    name = cls.__qualname__
    return name if cls.__module__ == "builtins" else f"{cls.__module__}.{name}"


def is_failure(exc: BaseException) -> bool:
    """Whether a test's exception is a failure (not a skip, an xfail or an interruption)."""
    import pytest

    if isinstance(exc, (KeyboardInterrupt, SystemExit, pytest.skip.Exception)):
        return False
    return not isinstance(exc, pytest.xfail.Exception)


def named_clause(message: str) -> str:
    """The clause a suite's assertion message starts with (``"CKPT-RT-1: ..."``), or ``""``."""
    match = _NAMED_CLAUSE.match(message)
    return match.group(1) if match else ""


def attribute(exc: BaseException, own: Sequence[str] = ()) -> Attribution:
    """The attribution of the exception a check's test raised: the clause a ``clause``
    block gave it, else the one its assertion message starts with.

    Of several distinct failures (an exception group), the first that breaks one of the
    check's ``own`` clauses (or names none), else the first: a check that found a violation
    of its own property fails on it, even if another example was blocked on the way.
    """
    return distinct_failures(exc, own)[0][1]


def distinct_failures(
    exc: BaseException, own: Sequence[str] = ()
) -> list[tuple[BaseException, Attribution]]:
    """Each failure a test's exception holds (one, or Hypothesis' several distinct failures)
    with its attribution, the one :func:`attribute` picks first, the others in Hypothesis'
    order."""
    pairs = [(leaf, _attribute_one(leaf)) for leaf in _candidates(exc)]
    first = next((i for i, (_, a) in enumerate(pairs) if not a.clause or a.clause in own), 0)
    return [pairs[first], *pairs[:first], *pairs[first + 1 :]]


def _attribute_one(exc: BaseException) -> Attribution:
    attribution = _attribute_plain(exc)
    # a suite's look through the round trip, and a training step after a load: both
    through = tuple(dict.fromkeys(looked_through(exc) + attribution.through))
    found = difference(attribution.message) if attribution.kind == "assertion" else ""
    return replace(
        attribution, through=through, difference=found, message=headline(attribution.message)
    )


#: the words of a suite's message that say where a value was seen, not what is wrong
_CONTEXT = re.compile(r"^(?:load )?rank \d+\b|\bworld size \d+|^(?:fsdp|model_parallel) \w+ save\b")
#: one comma-separated piece of those words: ``rank 0``, ``saved at ...``, ``strict=True``
_CONTEXT_PIECE = re.compile(
    r"^(?:(?:load )?rank \d+|.*\bworld size \d+.*|\w+=\S+|(?:fsdp|model_parallel) \w+ save"
    r"|write error|rank killed|\w+ on one rank)$"
)


def headline(first_line: str) -> str:
    """A suite's one-line message with the telling part first: ``CLAUSE: what is wrong
    (where it was seen)`` for a message that says where before what (``CKPT-STRICT-1: rank 0,
    saved at world size 2 (...), strict=True: nothing was raised``); other lines as they are.
    A trailing bare colon (an empty exception message quoted) says so."""
    line = first_line.rstrip()
    if line.endswith(":"):
        line = f"{line} (empty message)"
    clause_id, what, context = _split_context(line)
    return f"{clause_id}: {what} ({context})" if context else line


def _split_context(line: str) -> tuple[str, str, str]:
    """``(clause, what is wrong, where it was seen)`` of a suite's message that says where
    before what; ``("", line, "")`` for any other line."""
    clause_id = named_clause(line)
    if not clause_id or f"{clause_id}: " not in line:
        return "", line, ""
    body = line.split(f"{clause_id}: ", 1)[1]
    parts = _split_top(body, ": ")
    if len(parts) < 2 or not _CONTEXT.search(parts[0]):
        return "", line, ""
    context = _split_top(parts[0], ", ")
    what = parts[1:]
    while len(context) > 1 and not _CONTEXT_PIECE.search(context[-1]):
        what.insert(0, context.pop())  # "..., strict=True, unexpected model keys: ..."
    return clause_id, ": ".join(what), ", ".join(context)


def _assertion_key(message: str) -> str:
    """The masked key of a suite's assertion: what is wrong, without where it was seen (the
    same wrong answer whichever rank, world size, family or format met it)."""
    clause_id, what, context = _split_context(_first(message))
    return mask(f"{clause_id}: {what}") if context else mask(message)


def _split_top(text: str, separator: str) -> list[str]:
    """``text`` split at each ``separator`` (``": "`` or ``", "``) outside brackets and
    quotes."""
    parts, depth, start, quote = [], 0, 0, ""
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i + 2
    return [*parts, text[start:]]


#: a suite's rank job that loads a checkpoint (its module or function name says so: a load,
#: a round trip, a resume, a reshard): what trains in it may train on what a load left
_LOADING_JOB = re.compile(r"load|round_trip|resume|reshard")
#: a suite function that saves: a step under it trains what is about to be saved (or was
#: just saved), not what a load left (the round trip's save half, ``_round_trip_save``)
_SAVING = re.compile(r"save")


def _with_method(attribution: Attribution, traceback_text: str) -> Attribution:
    """``attribution`` with the strategy method the exception came out of; a training step
    in a job that loaded a checkpoint looks through the round trip ([Note: looking
    through]): a known load finding explains it."""
    if attribution.kind != "raised":
        return attribution
    frames = [(m["file"], m["func"]) for m in _FRAME.finditer(traceback_text)]
    suite = [i for i, (file, _) in enumerate(frames) if file.startswith(OWN_DIRS[-1])]
    if not suite:
        return attribution
    called = [func for file, func in frames[suite[-1] + 1 :] if not _own(file)]
    method = called[0] if called else ""
    loads = any(_LOADING_JOB.search(f"{Path(frames[i][0]).name}:{frames[i][1]}") for i in suite)
    loads = loads and not any(_SAVING.search(frames[i][1]) for i in suite)
    through = ROUND_TRIP_CLAUSES if method in TRAINING_METHODS and loads else ()
    return replace(attribution, method=method, through=through or attribution.through)


def _no_message(type_name: str, traceback_text: str, where: str) -> str:
    """The headline of an exception raised with an empty message: its type, the strategy's
    own frame it came through, and where it was raised."""
    short = type_name.rsplit(".", 1)[-1]
    own = _strategy_frame(traceback_text)
    if own and own != where:
        return f"{short} with an empty message in {own} (raised in {where})"
    return f"{short} with an empty message, raised in {where or 'an unknown place'}"


#: what a check was doing when the strategy method it called raised, in words
_DOING = {
    "save_checkpoint": "saving a checkpoint",
    "load_checkpoint": "loading a checkpoint",
    "setup_environment": "setting up the environment",
    "module_init_context": "building the model inside module_init_context",
    "setup_module": "setting up the model",
    "setup_optimizer": "setting up the optimizer",
    "setup_module_and_optimizers": "setting up the model and its optimizers",
    "forward": "a forward",
    "backward": "a backward",
    "optimizer_step": "an optimizer step",
    "clip_gradients_norm": "clipping the gradients",
    "no_backward_sync": "a step without gradient sync",
    "all_reduce": "an all_reduce",
    "broadcast": "a broadcast",
    "barrier": "a barrier",
    "teardown": "the teardown",
}
#: an exception text of fewer words does not say what happened on its own
_BARE_WORDS = 8


def _told(attribution: Attribution, text: str, traceback_text: str) -> Attribution:
    """``attribution`` whose headline is a sentence when the exception's own text is too
    bare to say what happened (a ``KeyError``'s key, torch's "Expected device to be set"):
    in which of the suite's jobs, what the check was doing (the strategy method it called),
    the exception's type and text, and the strategy's line: ``in trainer_load_rank, loading
    a checkpoint (load_checkpoint) raised KeyError 'param_groups' at team.py:575
    _load_optimizers``. The signature's key stays the masked text: only what is shown
    changes."""
    short = attribution.type_name.rsplit(".", 1)[-1]
    bare = short == "KeyError" or len(text.split()) < _BARE_WORDS
    if attribution.kind != "raised" or not text or not bare:
        return attribution
    suite = [
        m["func"] for m in _FRAME.finditer(traceback_text) if m["file"].startswith(OWN_DIRS[-1])
    ]
    method = attribution.method
    if not (method or suite):  # a test of the user's own: its words are its own
        return attribution
    doing = f"{_DOING.get(method, 'a call of')} ({method})" if method else "a call from the suite"
    job = f"in {suite[0]}, " if suite else ""  # the outermost: the rank job, or the test
    said = f"{short} {text}" if short == "KeyError" else f"{short}: {text}"
    at = f" at {attribution.where}" if attribution.where else ""
    return replace(attribution, message=f"{job}{doing} raised {said}{at}")


def _strategy_frame(text: str) -> str:
    """The innermost frame of the strategy's own code in a formatted traceback: neither
    shardcheck's nor an installed library's nor Python's; ``""`` when there is none."""
    frames = [(m["file"], m["line"], m["func"]) for m in _FRAME.finditer(text)]
    mine = [f for f in frames if not _own(f[0]) and not _installed(f[0])]
    if not mine:
        return ""
    file, line, func = mine[-1]
    return f"{_short_path(file)}:{line} {func}"


def _installed(path: str) -> bool:
    return "site-packages" in path or "dist-packages" in path or path.startswith(_STDLIB)


def _attribute_plain(exc: BaseException) -> Attribution:
    clause = clause_of(exc)
    found = checked_file_of(exc)  # the load met a file found right ([Note: a load after ...])
    if isinstance(exc, RankFailure):
        return _rank_attribution(exc, clause, found)
    where, outside = _where_in_text(_tb_text(exc.__traceback__))
    kind = "raised" if outside else "assertion"
    message = str(exc)
    clause = clause or named_clause(message)
    quoted = _RANK_ERROR.match(message)
    if quoted and not outside:
        # a suite's report of a rank's exception, with its traceback in the message (the API
        # probes): the rank's exception and where it was raised, as if it had come back raised
        in_text, outside_text = _where_in_text(message)
        if outside_text:
            type_name, text = quoted.group(1), quoted.group(2)
            return Attribution(clause, "raised", type_name, mask(text), in_text, text.strip())
    type_name = _type_name(type(exc))
    text = _tb_text(exc.__traceback__)
    first = _first(message) or _no_message(type_name, text, where)
    key = _assertion_key(message) if kind == "assertion" else mask(message)
    attribution = Attribution(clause, kind, type_name, key, where, first)
    attribution = _with_method(_strategy_site(attribution, text), text)
    attribution = _told(attribution, _first(message), text)
    return replace(attribution, message=told_after_right_file(attribution, found, _first(message)))


def _first(message: str) -> str:
    """The first non-blank line of ``message``, without terminal colour codes."""
    text = _ANSI.sub("", message)
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _rank_attribution(failure: RankFailure, clause: str, found: str = "") -> Attribution:
    if getattr(failure, "kind", "") == "hang":  # other ranks' errors follow from the hang
        return _hung_attribution(failure, clause)
    by_rank = {o.rank: o for o in failure.outcomes}
    first = by_rank[failure.failed_ranks[0]] if failure.failed_ranks else failure.outcomes[0]
    errors = [by_rank[r].error for r in failure.failed_ranks if by_rank[r].error is not None]
    own = [e for e in errors if e is not None and not e.is_distributed]
    error = own[0] if own else (first.error if first.error is not None else None)
    if error is not None:
        where, outside = _where_in_text(error.traceback)
        if not outside and getattr(failure, "kind", "") == "desync":  # the strategy entered it
            where, outside = _collective_site(str(failure)) or (where, outside)
        clause = clause or named_clause(error.message)
        kind = "raised" if outside else "assertion"
        line = _first(error.message) or _no_message(error.type_name, error.traceback, where)
        attribution = Attribution(clause, kind, error.type_name, mask(error.message), where, line)
        attribution = _with_method(_strategy_site(attribution, error.traceback), error.traceback)
        attribution = _told(attribution, _first(error.message), error.traceback)
        told = told_after_right_file(attribution, found, _first(error.message))
        return replace(attribution, message=told)
    if first.kind == "crashed":
        what = f"exit code {first.exitcode}"
        clause = clause or clause_at_crash(first.stacks)
        through = crashed_inside(first.stacks)
        message = f"rank crashed: {what}"
        return Attribution(clause, "crashed", "crash", mask(what), "", message, through=through)
    return _hung_attribution(failure, clause)


def _hung_attribution(failure: RankFailure, clause: str) -> Attribution:
    """A hang told by its first hung rank: where its stack is, why it was cut off (a
    distributed error on another rank only gave up waiting for it: [Note: a hang among
    other failures] in :mod:`harness.verdicts.failures`)."""
    by_rank = {o.rank: o for o in failure.outcomes}
    hung = [by_rank[r] for r in failure.failed_ranks if by_rank[r].kind == "hung"]
    first = hung[0] if hung else failure.outcomes[0]  # first failure first
    where, _ = _where_in_text(first.stacks)
    detail = first.detail or "the rank did not answer before its deadline"
    return Attribution(clause, "hung", "hang", mask(detail), where, detail)


def late_attribution(violation: LateViolation) -> Attribution:
    """The attribution of a violation recorded after a check's property (``after=True``)."""
    where, _ = _where_in_text(violation.traceback)
    return Attribution(
        violation.clause,
        "raised",
        violation.type_name,
        mask(violation.message),
        where,
        _first(violation.message),
    )
