"""What the rank pool needs from the way it reaches its ranks: the :class:`Transport` protocol.

:class:`harness.pool.rankpool.RankPool` decides everything that is policy: when a job has
failed, how long the other ranks get, when stacks are taken, whether to check health,
restart or give up. A transport only moves commands and replies and starts or ends the ranks'
processes or process groups. Two implement it:

- :class:`harness.pool.transports.pipes.PipeTransport` (local mode): ranks forked from a
  forkserver, one pipe each; it can kill and replace ranks.
- :class:`harness.pool.transports.store.StoreTransport` (attach mode): the ranks of a torchrun
  run, reached through torchrun's store; it cannot replace a rank.

[Note: adding a transport] A transport is one module in :mod:`harness.pool.transports` with a
class that has the :class:`Transport` members below and a module-level ``KIND``, a
:class:`TransportKind` (how a session opens it, warms it up and stops it), plus one line in
:data:`harness.pool.transports.TRANSPORTS` naming the module. A session picks its transport by
name (``HarnessConfig.transport``); nothing else in the harness names a transport.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from harness.wire.protocol import Command, Reply

if TYPE_CHECKING:
    from harness.config import HarnessConfig
    from harness.verdicts.outcomes import Outcome

__all__ = [
    "Bound",
    "PoolSettings",
    "RanksUnreachable",
    "Reply",
    "StackDump",
    "Transport",
    "TransportKind",
]


class Bound(NamedTuple):
    """A job's final cutoff, whatever its deadline, graces and progress: the time its test
    has left (see [Note: the test's time budget] in :mod:`harness.run.budget`).

    Args:
        at: when (``time.monotonic()``).
        why: the ``detail`` of a rank still inside the job then.
    """

    at: float
    why: str


@dataclass(frozen=True)
class PoolSettings:
    """How a pool starts and heals.

    Args:
        world_size: number of ranks.
        backend: ``gloo`` or ``nccl``.
        pg_timeout: initial process-group timeout in seconds.
        threads: torch intra-op threads per rank.
        start_timeout: seconds the ranks get to join the process group.
        failure_grace: seconds the other ranks get to finish once one rank failed.
        health_timeout: seconds the health check (state + barrier) may take.
        warm_up: run a tiny FSDP2 step on every rank at the pool's first start
            (:mod:`harness.rank.warmup`), so the first job is not slower than the rest.
        check_collectives: ranks check every collective across the group
            (:mod:`harness.verdicts.collectives`); a mismatch raises at once.
        lonely_grace: seconds, at least, that ranks still inside a job get once another
            rank finished it (more for a long job: see :func:`lonely_grace`).
        stall_after: seconds into a job before the waiting ranks' stacks are sampled for a
            stall (:mod:`harness.pool.stall`); 0 turns sampling off.
        stall_every: seconds between two stall samples.
        rank_timeout: the latest cutoff of a job whose ranks still work at its deadline
            (``--rank-timeout``; see [Note: slow is not hung] in :mod:`harness.pool.progress`).
    """

    world_size: int
    backend: str = "gloo"
    pg_timeout: float = 60.0
    threads: int = 1
    start_timeout: float = 120.0
    failure_grace: float = 3.0
    health_timeout: float = 10.0
    warm_up: bool = True
    check_collectives: bool = False
    lonely_grace: float = 5.0
    stall_after: float = 3.0
    stall_every: float = 2.0
    rank_timeout: float = 120.0


class RanksUnreachable(RuntimeError):
    """The transport has lost its way to the ranks (the message says why): the pool is lost."""


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
        """Start generation ``generation`` of the ranks; each answers ``ready`` to the token
        (torchrun's ranks with the seconds they took to leave their old group and join)."""
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

    def taken(self) -> bool:
        """Whether another pool's process group has taken the ranks since this transport
        last formed one: the pool forms its group again before the next job, a *switch*,
        not a heal. Never where each world size has ranks of its own (local); in attach mode
        every world size shares torchrun's ranks ([Note: sub-worlds] in
        :mod:`harness.pool.transports.store`)."""
        ...

    def close(self, timeout: float) -> None:
        """Tell every rank to leave; give them ``timeout`` seconds before ending them."""
        ...


class TransportKind(Protocol):
    """How a session uses one transport: a transport module's ``KIND`` (see
    [Note: adding a transport]).

    Attributes:
        name: the name it is registered under in :data:`harness.pool.transports.TRANSPORTS`.
    """

    name: str

    def gpu_ranks(self, config: HarnessConfig, world_size: int) -> int:
        """How many ranks of one machine need a GPU each in a pool of ``world_size`` ranks
        (``--backend auto`` chooses from it)."""
        ...

    def open(self, config: HarnessConfig, world_size: int, root: str) -> Transport:
        """A transport to the ranks of one world size, not started; ``root`` is the
        session's directory for files."""
        ...

    def warm_up(self, config: HarnessConfig) -> None:
        """Prepare, in the background, what the first pool needs (called once at start-up)."""
        ...

    def stop(self) -> None:
        """Stop what the transport keeps beyond its pools (at the end of the session)."""
        ...
