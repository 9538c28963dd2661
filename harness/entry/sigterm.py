"""SIGTERM stops a pytest session the way Ctrl-C does.

A cancelled CI job or ``timeout`` sends SIGTERM, whose default action ends the process at
once: no ``finally``, no ``atexit``, so the ranks' temporary directory stays behind and no
report is written. While the session runs, SIGTERM instead raises :class:`Terminated` (a
``KeyboardInterrupt``) in the main thread: pytest ends the session as interrupted, the pools
stop, the temporary files go and the conformance report lists the checks it never reached as
``not run``. A second SIGTERM during that clean-up is ignored, so the clean-up finishes; send
SIGKILL to end the process at once.

A signal handler's exception lands wherever the main thread happens to be, and Python
swallows one raised inside a ``__del__`` or a weakref callback (it prints "Exception ignored
in ..."): a nightly run lost its SIGTERM that way and went on. So the handler also records
the signal, and :func:`raise_if_terminated` (called before each test and each rank job)
raises it again.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["Terminated", "delivered", "install", "raise_if_terminated", "uninstall"]

_previous: Any = None
_installed = False
_depth = 0  # sessions inside sessions (pytester): only the outermost restores
_received = False  # SIGTERM arrived in this session (its exception may have been swallowed)
_MESSAGE = "SIGTERM: stopping the ranks, removing temporary files, writing the report"


class Terminated(KeyboardInterrupt):
    """The session received SIGTERM; pytest treats it as an interrupt (exit status 2)."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _received
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the clean-up below finish
    _received = True
    raise Terminated(_MESSAGE)


def raise_if_terminated() -> None:
    """Raise :class:`Terminated` again if SIGTERM arrived but the session goes on (its first
    exception was swallowed); the second raise clears the record, so clean-up is not
    interrupted twice."""
    global _received
    if _received:
        _received = False
        raise Terminated(_MESSAGE + " (raised again: the first was swallowed)")


def delivered() -> None:
    """pytest has seen the interrupt: nothing is left to raise again."""
    global _received
    _received = False


def install() -> bool:
    """Make SIGTERM interrupt the session (main thread only, and only where SIGTERM still
    has its default action: a handler someone else installed is kept). True if installed.

    Calls nest (a pytester session inside a session): each :func:`install` is paired with
    one :func:`uninstall`, and the outermost pair restores the action.
    """
    global _previous, _installed, _depth
    if threading.current_thread() is not threading.main_thread():
        return False
    _depth += 1
    if _installed or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return False
    _previous = signal.SIG_DFL
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True
    return True


def uninstall() -> None:
    """Undo one :func:`install`; the last one gives SIGTERM back its previous action."""
    global _installed, _depth, _received
    if _depth == 0 or threading.current_thread() is not threading.main_thread():
        return
    _depth -= 1
    if _depth == 0 and _installed:
        signal.signal(signal.SIGTERM, _previous)
        _installed = False
        _received = False
