"""A load of a checkpoint the controller already read and found right.

[Note: a load after a right file] A check that saves and then loads reads the checkpoint
first, as written (``suites/lib/controller/written.py``). When that file is right and the
load then fails, the file is not what is wrong: the strategy's load is. The headline says so
(``the full checkpoint as written matches the plain model and optimizer; the load raised
KeyError 'param_groups' at team.py:575 _load_optimizers``), so a user does not go looking
for the bug in the save. The suites wrap the load in the controller::

    with loading_checked_file("the full checkpoint as written matches ..."):
        run(round_trip_load_rank, ...)

An exception escaping it carries those words (:func:`checked_file_of`), and the conformance
plugin leads a failure raised inside ``load_checkpoint`` with them
(:func:`harness.conformance.findings.checked_headline.told_after_right_file`). The signature
does not change: grouping stays the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from harness.contract import Unsupported

__all__ = ["checked_file_of", "loading_checked_file"]

_ATTRIBUTE = "shardcheck_checked_file"


@contextmanager
def loading_checked_file(found: str) -> Iterator[None]:
    """The body loads a checkpoint the controller read and found right: an exception escaping
    it carries ``found`` (what was found right, in words), unless an inner block set its own.
    With ``found`` empty (the file could not be read, so nothing was found right) the body runs
    as it is.

    Raises:
        TypeError: ``found`` is not a string.
    """
    if not isinstance(found, str):
        raise TypeError(
            f"loading_checked_file({found!r}) takes the words that say what was found right, "
            "such as 'the full checkpoint as written matches the plain model and optimizer' "
            "(what check_written returns), or '' when nothing was."
        )
    if not found.strip():
        yield
        return
    try:
        yield
    except Exception as exc:
        if not isinstance(exc, Unsupported) and not checked_file_of(exc):
            try:
                setattr(exc, _ATTRIBUTE, found)
            except AttributeError:  # an exception type with __slots__: cannot carry it
                pass
        raise


def checked_file_of(exc: BaseException) -> str:
    """What the controller found right in the checkpoint ``exc`` was raised loading, or
    ``""``."""
    value = getattr(exc, _ATTRIBUTE, "")
    return value if isinstance(value, str) else ""
