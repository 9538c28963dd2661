"""Attach mode's transport: the ranks of a torchrun run, reached through torchrun's store.

The controller writes numbered commands and each rank (:mod:`harness.rank.attached`) writes
its reply, with its output, under the same number (the keys are listed in
:mod:`harness.wire.attach`); the command's number is its token. A rank's watchdog thread
bumps a heartbeat, dumps its stacks when asked and aborts a job the controller gave up on.
The transport cannot start or kill processes:

- a new generation is a new default process group formed by the same processes;
- every world size from 1 to torchrun's is served by the same processes (see
  [Note: sub-worlds]);
- recovering from a hang aborts the job on every rank (``SIGUSR2``) and waits for the hung
  ranks to come back; one that does not leaves the pool lost;
- a rank whose heartbeat stops (crashed, killed, node lost) is reported gone: torchrun
  cannot replace it, so the pool is lost and the run ends.

[Note: sub-worlds] A session keeps one pool per world size (``pool_for``), and under torchrun
each of them is a :class:`StoreTransport` over the one :class:`AttachChannel` to torchrun's
``N`` ranks: one numbered command stream, one heartbeat per rank. A command is for the first
``k`` ranks, ``k`` the world size of the pool that sent it (``to/<seq>``); the others skip it
and wait for the next one, still heartbeating. A pool of size ``k`` starts its generation by
having ranks ``0..k-1`` leave the process group they are in and form a new *default* process
group of ``k`` ranks through a fresh store prefix (``pg/<seq>``); the other ranks leave theirs
when they see a command that is not for them. So the strategy sees an ordinary default group:
``dist.get_world_size() == k``, ``dist.get_rank() < k``. Only one group is formed at a time:
a pool whose ranks another pool's group took since (:meth:`StoreTransport.taken`) forms its
group again before its next job. That is a *switch*, not a heal; like the local pools, which
keep the ranks of each size between jobs, a group stays formed until a job of another size
comes, so consecutive jobs of one size switch once. The pool times each switch
(``RankPool.switches``) and the run's summary prints their cost.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

from harness.pool.transport import RanksUnreachable, Reply, StackDump
from harness.pool.transports.pipes import PRELOAD, preload_for
from harness.wire.attach import AttachInfo, AttachStart, connect, key
from harness.wire.fnref import rewritten_modules
from harness.wire.protocol import Command, Kind

if TYPE_CHECKING:
    from harness.config import HarnessConfig
    from harness.pool.transport import PoolSettings, Transport
    from harness.verdicts.outcomes import Outcome

__all__ = ["KIND", "AttachChannel", "StoreTransport", "TorchrunRanks"]

RANK_ENV_PREFIXES = ("SHARDCHECK_RANK_",)  # controller settings the ranks must see
WAIT_SLICE = 0.25  # longest wait for replies before looking at the heartbeats
BEAT_CHECK_EVERY = 0.5  # seconds between two looks at the heartbeats
STORE_ERRORS = (dist.DistError, ConnectionError)


class AttachChannel:
    """The one command stream to torchrun's ranks that the pools of every world size share
    (see [Note: sub-worlds]).

    Args:
        info: where the store is and how many ranks there are.
        lost_after: seconds without a heartbeat after which a rank counts as gone.
    """

    def __init__(
        self, info: AttachInfo, lost_after: float = 10.0, preload: tuple[str, ...] = ()
    ) -> None:
        self.info = info
        self.lost_after = lost_after
        self.store = connect(info)
        #: what every rank imports before its first process group (``AttachStart.preload``)
        self.preload = preload
        environ = {k: v for k, v in os.environ.items() if k.startswith(RANK_ENV_PREFIXES)}
        # ranks outside the first groups prepare while they wait (see `preload` in the keys)
        self.store.set(key("preload"), pickle.dumps((environ, preload)))
        self.seq = 0
        self.closed = False
        #: the ``start`` command whose process group the ranks are in now (0: none)
        self.formed = 0
        #: ranks that ran the warm-up step (it is a collective: all of a group run it or none)
        self.warmed: set[int] = set()
        self._beats: dict[int, tuple[int, float]] = {}
        self.next_beat_check = 0.0

    @contextmanager
    def reaching(self) -> Iterator[None]:
        """Turn a failing store call into :class:`RanksUnreachable`."""
        try:
            yield
        except STORE_ERRORS as exc:
            raise RanksUnreachable(
                f"lost contact with torchrun's store at {self.info.host}:{self.info.port} "
                f"({type(exc).__name__}: {exc}): the torchrun agent has exited (a rank died and "
                "torchrun stopped the run, or torchrun was interrupted)"
            ) from None

    def send(self, command: Command, world_size: int) -> int:
        """Write ``command`` for the first ``world_size`` ranks as the next numbered
        command; return its number."""
        if self.closed:
            raise RanksUnreachable("attach mode: the ranks were already told to stop")
        self.seq += 1
        with self.reaching():
            # the command first: a rank that reads `to/<seq>` may read `cmd/<seq>` at once
            self.store.set(key("cmd", self.seq), pickle.dumps(command))
            self.store.set(key("to", self.seq), str(world_size))
        self.next_beat_check = time.monotonic() + BEAT_CHECK_EVERY
        return self.seq

    def silent(self, ranks: Sequence[int]) -> dict[int, float]:
        """The ranks among ``ranks`` whose heartbeat stopped, with the seconds of silence."""
        now, silent = time.monotonic(), {}
        for rank in ranks:
            count = int(self.store.add(key("beat", rank), 0))
            last = self._beats.get(rank)
            if last is None or last[0] != count:
                self._beats[rank] = (count, now)
            elif now - last[1] > self.lost_after:
                silent[rank] = now - last[1]
        return silent

    def close(self) -> None:
        """Tell every rank to leave (the torchrun workers then exit)."""
        if self.closed:
            return
        try:
            self.send(Command(Kind.STOP, 0), self.info.world_size)
        except (RuntimeError, OSError):
            pass  # the store is gone: the ranks are gone too
        self.closed = True


class StoreTransport:
    """The first ``world_size`` ranks of one torchrun run (see the module docstring).

    Args:
        channel: the command stream to torchrun's ranks, shared by every world size.
        world_size: how many of its ranks this pool uses (1 to torchrun's world size).
        abort_grace: seconds the ranks get to come back after a job is aborted.
    """

    name = "torchrun"
    replaces_ranks = False

    def __init__(
        self,
        channel: AttachChannel,
        world_size: int | None = None,
        abort_grace: float = 15.0,
    ) -> None:
        self.channel = channel
        self.info = channel.info
        self.world_size = self.info.world_size if world_size is None else world_size
        if not 1 <= self.world_size <= self.info.world_size:
            raise ValueError(
                f"a pool of world size {self.world_size} cannot run on torchrun's "
                f"{self.info.world_size} ranks: attach mode serves world sizes 1 to "
                f"{self.info.world_size}."
            )
        self.abort_grace = abort_grace
        self.store = channel.store
        self._formed = 0  # the `start` command of this pool's group (0: never formed)

    @property
    def pids(self) -> list[int]:
        """None: the ranks are torchrun's processes, possibly on other machines."""
        return []

    @property
    def closed(self) -> bool:
        """Whether the ranks were told to stop."""
        return self.channel.closed

    def taken(self) -> bool:
        """Whether the ranks are in another pool's process group (another world size formed
        one since this pool's): this pool must form its group again, a switch."""
        return self.channel.formed not in (0, self._formed)

    def start(self, generation: int, settings: PoolSettings) -> int:
        """Ask ranks ``0..world_size-1`` to form process group ``generation`` of this pool
        (leaving the group they are in; the others leave theirs)."""
        environ = {k: v for k, v in os.environ.items() if k.startswith(RANK_ENV_PREFIXES)}
        members = set(range(self.world_size))
        payload = AttachStart(
            generation=generation,
            world_size=self.world_size,
            backend=settings.backend,
            pg_timeout=settings.pg_timeout,
            threads=settings.threads,
            rewrite=rewritten_modules(),
            preload=self.channel.preload,
            warm_up=settings.warm_up and not members <= self.channel.warmed,
            environ=environ,
        )
        token = self.send(Command(Kind.START, 0, payload))
        self.channel.formed = self._formed = token
        if payload.warm_up:
            self.channel.warmed |= members
        return token

    def send(self, command: Command) -> int:
        """Write ``command`` for this pool's ranks; its token is its number."""
        return self.channel.send(command, self.world_size)

    def poll(self, token: int, ranks: Sequence[int], timeout: float) -> list[Reply]:
        """Block on the store until the replies of ``ranks`` are all set, ``WAIT_SLICE`` at
        most; then take those that are, or else look at the heartbeats."""
        keys = [key("reply", token, rank) for rank in ranks]
        channel = self.channel
        with channel.reaching():
            if self._all_arrived(keys, timeout):
                ready = list(ranks)
            else:
                ready = [rank for rank, k in zip(ranks, keys, strict=True) if self.store.check([k])]
            if ready:
                return self._receive(token, ready)
            if time.monotonic() < channel.next_beat_check:
                return []
            channel.next_beat_check = time.monotonic() + BEAT_CHECK_EVERY
            silent = channel.silent(ranks)
        detail = (
            "no heartbeat for {:.0f} s: the process died or its node is unreachable (torchrun "
            "cannot replace a rank inside a run)"
        )
        return [Reply(rank, None, detail=detail.format(s)) for rank, s in silent.items()]

    def _all_arrived(self, keys: list[str], timeout: float) -> bool:
        """Wait (``WAIT_SLICE`` at most, ``timeout`` at most) until every key is set."""
        limit = max(0.001, min(WAIT_SLICE, timeout))
        try:  # the store answers as soon as the keys are set; a timed-out wait is harmless
            self.store.wait(keys, timedelta(seconds=limit))
        except dist.DistStoreError:
            return False
        return True

    def _receive(self, token: int, ranks: list[int]) -> list[Reply]:
        """The replies of ``ranks`` to ``token``, which have arrived (then dropped)."""
        keys = [key("reply", token, rank) for rank in ranks]
        replies = []
        for rank, data in zip(ranks, self.store.multi_get(keys), strict=True):
            event, stdout, stderr = pickle.loads(data)
            replies.append(Reply(rank, event, stdout, stderr))
        for reply_key in keys:
            self.store.delete_key(reply_key)
        return replies

    def dump_stacks(
        self, token: int, ranks: Sequence[int], settle: float = 3.0
    ) -> dict[int, StackDump]:
        """Ask the ranks still in ``token`` for their stacks; wait ``settle`` s at most."""
        found: dict[int, StackDump] = {}
        with self.channel.reaching():
            self.store.set(key("dump", token), "1")
            deadline = time.monotonic() + settle
            while len(found) < len(ranks) and time.monotonic() < deadline:
                for rank in ranks:
                    stacks_key = key("stacks", token, rank)
                    if rank not in found and self.store.check([stacks_key]):
                        found[rank] = StackDump(*pickle.loads(self.store.get(stacks_key)))
                time.sleep(0.05)
        return found

    def done(self, token: int, outcomes: Sequence[Outcome]) -> None:
        """Drop the command's key once every rank of the pool has answered it (output came
        with the replies; the ranks outside the pool read only ``to/<seq>``)."""
        if all(o.kind != "hung" for o in outcomes):
            with self.channel.reaching():
                self.store.delete_key(key("cmd", token))

    def recover(self, token: int | None, late: Sequence[int]) -> str | None:
        """Abort ``token`` on every rank and wait ``abort_grace`` s for the ``late`` ranks'
        replies; the ranks then form a new process group when the pool starts one."""
        if token is None:
            return None  # no rank is inside a command
        with self.channel.reaching():
            self.store.set(key("abort", token), "1")
            deadline = time.monotonic() + self.abort_grace
            waiting = list(late)
            while waiting and time.monotonic() < deadline:
                waiting = [r for r in waiting if not self.store.check([key("reply", token, r)])]
                time.sleep(0.05)
        if not waiting:
            return None
        return (
            f"rank(s) {waiting} did not leave the aborted job within {self.abort_grace:.0f} s; "
            "attach mode cannot kill or replace a torchrun rank, so the run ends here."
        )

    def alive(self) -> bool:
        """Always: a rank that went away is noticed by its heartbeat during the next job."""
        return True

    def close(self, timeout: float) -> None:
        """Tell every rank of the run to leave (the torchrun workers then exit): the pools
        of every world size end together."""
        self.channel.close()


class TorchrunRanks:
    """The ``torchrun`` transport as a session uses it
    (:class:`harness.pool.transport.TransportKind`): the ranks are torchrun's, already running
    when the session starts."""

    name = "torchrun"

    def __init__(self) -> None:
        self._channels: dict[AttachInfo, AttachChannel] = {}

    def gpu_ranks(self, config: HarnessConfig, world_size: int) -> int:
        """One GPU per local rank of a torchrun node, whatever the world size: the backend
        is the same on every node and for every sub-world (a gloo rank hides the GPUs, which
        cannot be undone in a process that used them)."""
        return _attach_info(config).local_world_size

    def open(self, config: HarnessConfig, world_size: int, root: str) -> Transport:
        """The first ``world_size`` of torchrun's ranks, over the run's one channel."""
        info = _attach_info(config)
        channel = self._channels.get(info)
        if channel is None:
            preload = (*PRELOAD, *preload_for(config))
            channel = self._channels[info] = AttachChannel(info, preload=preload)
        return StoreTransport(channel, world_size)

    def warm_up(self, config: HarnessConfig) -> None:
        """Nothing: torchrun started the ranks, and they imported torch already."""

    def stop(self) -> None:
        """Nothing: the ranks are torchrun's."""


def _attach_info(config: HarnessConfig) -> AttachInfo:
    if config.attach is None:
        raise ValueError(
            "the torchrun transport needs attach-mode information (HarnessConfig.attach); "
            "start the run with `torchrun ... -m harness.attach -- pytest ...`."
        )
    return config.attach


#: the ``torchrun`` transport ([Note: adding a transport] in :mod:`harness.pool.transport`)
KIND = TorchrunRanks()
