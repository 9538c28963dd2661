"""Headlines: one failure told in one line, what is wrong first.

A suite's message that says where before what (``CKPT-STRICT-1: rank 0, saved at world size
2 (...), strict=True: nothing was raised``) is turned round (:func:`headline`); an exception
whose own text is too bare to say what happened (a ``KeyError``'s key) is told as a sentence
of what the check was doing (:func:`told`); one raised with an empty message names its type
and where it came from (:func:`no_message`). Only what is shown changes: a finding's
signature keeps the masked text (:mod:`harness.conformance.findings.masking`).
"""

from __future__ import annotations

import re

from harness.conformance.findings.checked_headline import Failure
from harness.conformance.findings.crash_site import OWN_DIRS
from harness.conformance.findings.masking import first_line_of, mask
from harness.conformance.findings.tracebacks import FRAME, strategy_frame

__all__ = ["assertion_key", "headline", "named_clause", "no_message", "told"]

#: a suite's assertion message that starts with the clause it checks: ``"CKPT-RT-1: ..."``
_NAMED_CLAUSE = re.compile(r"^\s*(?:rank \d+: )?([A-Z]+(?:-[A-Z]+)*-\d+):")
#: the words of a suite's message that say where a value was seen, not what is wrong
_CONTEXT = re.compile(r"^(?:load )?rank \d+\b|\bworld size \d+|^(?:fsdp|model_parallel) \w+ save\b")
#: one comma-separated piece of those words: ``rank 0``, ``saved at ...``, ``strict=True``
_CONTEXT_PIECE = re.compile(
    r"^(?:(?:load )?rank \d+|.*\bworld size \d+.*|\w+=\S+|(?:fsdp|model_parallel) \w+ save"
    r"|write error|rank killed|\w+ on one rank)$"
)
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


def named_clause(message: str) -> str:
    """The clause a suite's assertion message starts with (``"CKPT-RT-1: ..."``), or ``""``."""
    match = _NAMED_CLAUSE.match(message)
    return match.group(1) if match else ""


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


def assertion_key(message: str) -> str:
    """The masked key of a suite's assertion: what is wrong, without where it was seen (the
    same wrong answer whichever rank, world size, family or format met it)."""
    clause_id, what, context = _split_context(first_line_of(message))
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


def no_message(type_name: str, traceback_text: str, where: str) -> str:
    """The headline of an exception raised with an empty message: its type, the strategy's
    own frame it came through, and where it was raised."""
    short = type_name.rsplit(".", 1)[-1]
    own = strategy_frame(traceback_text)
    if own and own != where:
        return f"{short} with an empty message in {own} (raised in {where})"
    return f"{short} with an empty message, raised in {where or 'an unknown place'}"


def told(failure: Failure, text: str, traceback_text: str) -> str:
    """The headline of ``failure``, a sentence when the exception's own text is too bare to
    say what happened (a ``KeyError``'s key, torch's "Expected device to be set"): in which
    of the suite's jobs, what the check was doing (the strategy method it called), the
    exception's type and text, and the strategy's line: ``in trainer_load_rank, loading a
    checkpoint (load_checkpoint) raised KeyError 'param_groups' at team.py:575
    _load_optimizers``; else its message as it is. The signature's key stays the masked
    text: only what is shown changes.

    Args:
        failure: the failure's attribution.
        text: the first line of the exception's own message.
        traceback_text: the exception's formatted traceback.
    """
    short = failure.type_name.rsplit(".", 1)[-1]
    bare = short == "KeyError" or len(text.split()) < _BARE_WORDS
    if failure.kind != "raised" or not text or not bare:
        return failure.message
    suite = [
        m["func"] for m in FRAME.finditer(traceback_text) if m["file"].startswith(OWN_DIRS[-1])
    ]
    method = failure.method
    if not (method or suite):  # a test of the user's own: its words are its own
        return failure.message
    doing = f"{_DOING.get(method, 'a call of')} ({method})" if method else "a call from the suite"
    job = f"in {suite[0]}, " if suite else ""  # the outermost: the rank job, or the test
    said = f"{short} {text}" if short == "KeyError" else f"{short}: {text}"
    at = f" at {failure.where}" if failure.where else ""
    return f"{job}{doing} raised {said}{at}"
