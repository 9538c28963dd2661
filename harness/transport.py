"""What the rank pool needs from the way it reaches its ranks: the :class:`Transport` protocol.

:class:`harness.pool.RankPool` decides everything that is policy: when a job has failed, how
long the other ranks get, when stacks are taken, whether to check health, restart or give
up. A transport only moves commands and replies and starts or ends the ranks' processes or
process groups. Two implement it:

- :class:`harness.transports.pipes.PipeTransport` (local mode): ranks forked from a
  forkserver, one pipe each; it can kill and replace ranks.
- :class:`harness.transports.store.StoreTransport` (attach mode): the ranks of a torchrun
  run, reached through torchrun's store; it cannot replace a rank.

A third transport is one new module with a class that has the members below, and one branch
in :func:`harness.api.pool_for` that makes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from harness.protocol import Command, Event

if TYPE_CHECKING:
    from harness.outcomes import Outcome
    from harness.pool import PoolSettings

__all__ = ["RanksUnreachable", "Reply", "StackDump", "Transport"]


class RanksUnreachable(RuntimeError):
    """The transport has lost its way to the ranks (the message says why): the pool is lost."""


class Reply(NamedTuple):
    """One rank's answer to a command, or (``event`` is ``None``) the news that it is gone.

    Args:
        rank: the rank.
        event: what it answered; ``None`` when the rank crashed or went silent.
        stdout: its output, when the transport carries output with replies.
        stderr: likewise.
        exitcode: a gone rank's exit code, when known.
        detail: why the transport counts the rank as gone, when it knows more than that.
        stacks: the stacks a gone rank left (``faulthandler``'s fatal-error dump).
    """

    rank: int
    event: Event | None
    stdout: str = ""
    stderr: str = ""
    exitcode: int | None = None
    detail: str = ""
    stacks: str = ""


class StackDump(NamedTuple):
    """The Python stacks of a rank still inside a command, with its output so far (when the
    transport carries output with the stacks)."""

    stacks: str
    stdout: str = ""
    stderr: str = ""


class Transport(Protocol):
    """How a pool reaches the ranks of one world size.

    A *token* names one command sent to every rank; replies are matched to it, so a late
    answer to an older command is never taken for the current one.

    Attributes:
        name: how messages name the ranks (``local``, ``torchrun``).
        world_size: the number of ranks.
        replaces_ranks: whether :meth:`recover` kills the ranks, so the next generation
            starts fresh processes. When it cannot, the ranks must leave a job by themselves
            (a rank blocked inside a collective does so only at the process group's timeout),
            so the pool ends a job only at its deadline or after a failure, never checks
            collectives (installed once per process), re-forms the group at once after a
            heal, and a generation that cannot form ends the run.
    """

    name: str
    world_size: int
    replaces_ranks: bool

    @property
    def pids(self) -> list[int]:
        """The rank processes' pids on this machine, index = rank (empty when there are none)."""
        ...

    def start(self, generation: int, settings: PoolSettings) -> int:
        """Start generation ``generation`` of the ranks; each answers ``ready`` to the token."""
        ...

    def send(self, command: Command) -> int:
        """Send ``command`` to every rank; return its token."""
        ...

    def poll(self, token: int, ranks: Sequence[int], timeout: float) -> list[Reply]:
        """Replies of ``ranks`` to ``token`` that arrive within ``timeout`` seconds (or
        fewer: an empty list is no verdict), and any of them found gone."""
        ...

    def dump_stacks(self, token: int, ranks: Sequence[int]) -> dict[int, StackDump]:
        """The stacks of ``ranks``, still inside ``token``, by rank (a few seconds at most)."""
        ...

    def done(self, token: int, outcomes: Sequence[Outcome]) -> None:
        """The pool is done with ``token``: add to ``outcomes`` what the transport keeps
        beside the replies (output files, traces) and drop what it kept for the command."""
        ...

    def recover(self, token: int | None, late: Sequence[int]) -> str | None:
        """End the current generation: every rank leaves ``token`` (if any) and can start
        the next one; the ``late`` ranks, still inside it, are waited for. Returns why the
        ranks cannot go on, or ``None``."""
        ...

    def alive(self) -> bool:
        """Whether every rank of the current generation is still there to take a command."""
        ...

    def close(self, timeout: float) -> None:
        """Tell every rank to leave; give them ``timeout`` seconds before ending them."""
        ...
