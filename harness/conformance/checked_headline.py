"""The headline of a load that failed on a checkpoint found right as written.

[Note: a load after a right file] (in :mod:`harness.verdicts.checked_file`) says when the
controller found the file right. A failure raised inside the strategy's ``load_checkpoint``
after that leads with it: ``the full checkpoint as written matches the plain model and
optimizer; the load raised KeyError 'param_groups' at team.py:575 _load_optimizers``. Only
the headline changes; the signature's key is the masked exception text as before.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # signatures calls this module: no import at run time
    from harness.conformance.signatures import Attribution

__all__ = ["told_after_right_file"]


def told_after_right_file(attribution: Attribution, found: str, text: str) -> Attribution:
    """``attribution`` whose headline says the file was checked and found right (``found``)
    before it says what the load raised, for an exception raised inside ``load_checkpoint``;
    any other failure (a crash, a hang, a suite's assertion, a step after the load) as it is.

    Args:
        attribution: the failure.
        found: what the controller found right, in words, or ``""``.
        text: the first line of the exception's own message (``""``: it had none, and the
            attribution's message already names its type and where it was raised).
    """
    if not found or attribution.kind != "raised" or attribution.method != "load_checkpoint":
        return attribution
    short = attribution.type_name.rsplit(".", 1)[-1]
    if not text:
        said = attribution.message  # "AssertionError with an empty message in ..."
    else:
        quoted = f"{short} {text}" if short == "KeyError" else f"{short}: {text}"
        said = f"{quoted} at {attribution.where}" if attribution.where else quoted
    return replace(attribution, message=f"{found}; the load raised {said}")
