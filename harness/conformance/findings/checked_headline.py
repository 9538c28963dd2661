"""The headline of a load that failed on a checkpoint found right as written.

[Note: a load after a right file] (in :mod:`harness.verdicts.checked_file`) says when the
controller found the file right. A failure raised inside the strategy's ``load_checkpoint``
after that leads with it: ``the full checkpoint as written matches the plain model and
optimizer; the load raised KeyError 'param_groups' at team.py:575 _load_optimizers``. Only
the headline changes; the signature's key is the masked exception text as before.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Failure", "told_after_right_file"]


class Failure(Protocol):
    """What this module reads of a failure's attribution
    (:class:`harness.conformance.findings.signatures.Attribution`, which calls it: no import
    back)."""

    @property
    def kind(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def type_name(self) -> str: ...
    @property
    def where(self) -> str: ...
    @property
    def message(self) -> str: ...


def told_after_right_file(failure: Failure, found: str, text: str) -> str:
    """The headline of ``failure``: it says the file was checked and found right (``found``)
    before it says what the load raised, for an exception raised inside ``load_checkpoint``;
    any other failure's (a crash, a hang, a suite's assertion, a step after the load) as it
    is.

    Args:
        failure: the failure's attribution.
        found: what the controller found right, in words, or ``""``.
        text: the first line of the exception's own message (``""``: it had none, and the
            attribution's message already names its type and where it was raised).
    """
    if not found or failure.kind != "raised" or failure.method != "load_checkpoint":
        return failure.message
    short = failure.type_name.rsplit(".", 1)[-1]
    if not text:
        said = failure.message  # "AssertionError with an empty message in ..."
    else:
        quoted = f"{short} {text}" if short == "KeyError" else f"{short}: {text}"
        said = f"{quoted} at {failure.where}" if failure.where else quoted
    return f"{found}; the load raised {said}"
