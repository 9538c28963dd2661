"""Local ranks: processes forked from a forkserver, each reached through a pipe.

Ranks are forked from multiprocessing's forkserver, which imports torch and the
distributed/FSDP/DTensor/checkpoint modules once (``PRELOAD``), so a rank is ready to join a
process group a few milliseconds after it is forked (plain ``spawn`` would import torch in
every rank: about twice as slow here). Computing anything in the forkserver is avoided:
thread pools started there do not survive ``fork``. The rank side is :mod:`harness.rank.worker`.

Each rank leads its own process group, so ending a generation kills whatever a rank started
with it, and holds the read end of a *life* pipe: it kills itself when the controller dies.
Ranks rendezvous through a ``TCPStore`` on port 0 that the controller owns. A poll waits on
the ranks' pipes *and* process sentinels, so a crashed rank is noticed at once.

Per generation, every rank has three files under ``<session>/ws<N>-g<gen>/``: its stdout and
stderr (the rank points fd 1 and 2 at them and empties them at each job start) and its stack
file (``faulthandler`` writes the fatal-error dump there, and the stacks of all threads on
``SIGUSR1``). They are read after a command, a crash or a hang, so output and stacks survive
a rank that died.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from harness.pool.transport import Reply, StackDump
from harness.rank.worker import END_OF_DUMP, STACK_SIGNAL, WorkerSpec, worker_main
from harness.verdicts.flight import last_collectives, trace_prefix
from harness.wire.fnref import rewritten_modules
from harness.wire.protocol import Command, Event, Kind, decode, encode

if TYPE_CHECKING:
    from harness.config import HarnessConfig
    from harness.pool.transport import PoolSettings, Transport
    from harness.verdicts.outcomes import Outcome

__all__ = [
    "KIND",
    "PRELOAD",
    "LocalRanks",
    "PipeTransport",
    "RankFiles",
    "forkserver_context",
    "kill_rank",
    "preload_for",
    "start_forkserver",
    "stop_forkserver",
]

PRELOAD = (
    "torch",
    "numpy",
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.device_mesh",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "harness.torch_compat",  # torch's checkpoint wrapper and FSDP's wrap policies
    "torch._dynamo",  # imported lazily by the first FSDP2 step: 2+ s on the first job
    "torch.optim",
    "numpy.random",
    "harness.rank.worker",
)


def preload_for(config: HarnessConfig) -> tuple[str, ...]:
    """What the forkserver imports besides :data:`PRELOAD` for a session: the strategy's
    module, the rank context, and the test-side modules this process already loaded (a
    rank imports them when it finds a test module's function)."""
    wanted = [config.strategy.partition(":")[0], "harness.rank.context"]
    loaded = ("pytest", "_pytest.assertion.rewrite", "hypothesis")
    wanted += [m for m in loaded if m in sys.modules]
    return tuple(wanted)


def forkserver_context(extra_preload: Sequence[str] = ()) -> Any:
    """The forkserver context, preloading torch's distributed stack (before it starts)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*PRELOAD, *extra_preload])
    return context


def start_forkserver(extra_preload: Sequence[str] = ()) -> None:
    """Start the forkserver now: it imports torch in the background, so the ranks start
    sooner."""
    forkserver_context(extra_preload)
    multiprocessing.forkserver.ensure_running()


def stop_forkserver() -> None:
    """Stop multiprocessing's forkserver at once, even while it still imports torch."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if server is None or pid is None or not hasattr(server, "_stop"):
        return
    try:
        os.kill(
            pid, signal.SIGKILL
        )  # no rank is left (every transport closed); nothing to wait for
    except ProcessLookupError:
        pass
    server._stop()


def kill_rank(pid: int | None) -> None:
    """SIGKILL the rank's process group (the rank and anything it started)."""
    if pid is None:
        return
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class RankFiles:
    """Paths of one generation's per-rank files, and reading them.

    Args:
        directory: the generation's directory (created here).
        world_size: number of ranks.
    """

    def __init__(self, directory: str, world_size: int) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self._stack_pos = [0] * world_size

    def path(self, rank: int, what: str) -> str:
        """``stdout``, ``stderr`` or ``stacks`` file of ``rank``."""
        return os.path.join(self.directory, f"rank{rank}.{what}")

    def read_output(self, outcomes: Sequence[Outcome]) -> None:
        """Fill each outcome's ``stdout`` and ``stderr`` from its rank's files."""
        for outcome in outcomes:
            outcome.stdout = _read_text(self.path(outcome.rank, "stdout"))
            outcome.stderr = _read_text(self.path(outcome.rank, "stderr"))

    def new_stacks(self, rank: int) -> str:
        """What the rank's stack file gained since the last read (a crash's fatal-error dump
        after any asked-for dumps not yet read), without the end-of-dump lines."""
        data = self._unread(rank)
        self._stack_pos[rank] += len(data)
        return data.decode("utf-8", "replace").replace(END_OF_DUMP, "")

    def _unread(self, rank: int) -> bytes:
        try:
            with open(self.path(rank, "stacks"), "rb") as f:
                f.seek(self._stack_pos[rank])
                return f.read()
        except OSError:
            return b""

    def last_whole_dump(self, rank: int) -> str | None:
        """The last asked-for dump the rank finished writing since the last read (``None``
        while none is whole); the file is read up to that dump's end (see [Note: a dump is
        read whole])."""
        data = self._unread(rank)
        marker = END_OF_DUMP.encode()
        end = data.rfind(marker)
        if end < 0:
            return None
        start = data.rfind(marker, 0, end)
        start = 0 if start < 0 else start + len(marker)
        self._stack_pos[rank] += end + len(marker)
        return data[start:end].decode("utf-8", "replace")

    def collect_stacks(self, ranks: Sequence[int], settle: float = 2.0) -> dict[int, str]:
        """Wait (at most ``settle`` s) for the dumps of ``ranks``, already signalled.

        [Note: a dump is read whole] ``faulthandler`` writes a dump in many small writes, and
        a rank's dumping thread can lose its core between two of them on a busy machine. A
        dump read then was cut after some of its threads, and the rest began the next read:
        two samples of a sleeping rank differed, "slow is not hung" took the rank for one
        whose stack moved, and a 3 s deadline became 16 s (seen once in a whole CI run). So a
        rank writes :data:`END_OF_DUMP` after each dump it was asked for, and only the last
        whole dump counts; one not whole within ``settle`` is read by the next sample."""
        stacks: dict[int, str] = {}
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and len(stacks) < len(ranks):
            time.sleep(0.05)
            for rank in ranks:
                if rank not in stacks and (dump := self.last_whole_dump(rank)) is not None:
                    stacks[rank] = dump
        return stacks


def _read_text(path: str) -> str:
    try:
        if os.stat(path).st_size == 0:
            return ""
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


class PipeTransport:
    """Local rank processes of one world size (see the module docstring).

    Args:
        root: directory for the per-rank output and stack files of every generation.
        world_size: number of ranks.
        preload: modules the forkserver imports besides :data:`PRELOAD`.
    """

    name = "local"
    replaces_ranks = True

    def __init__(self, root: str, world_size: int, preload: Sequence[str] = ()) -> None:
        self.root = root
        self.world_size = world_size
        self.preload = tuple(preload)
        self.backend = "gloo"
        self.files = RankFiles(os.path.join(root, f"ws{world_size}-g0"), 0)
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self._lives: list[Connection] = []
        self._owner: dict[Any, int] = {}  # pipe or process sentinel -> rank
        self._store: Any = None

    @property
    def pids(self) -> list[int]:
        """The rank processes' pids, index = rank (empty when not started)."""
        return [p.pid for p in self.procs]

    def start(self, generation: int, settings: PoolSettings) -> int:
        """Fork the ranks of ``generation``; they answer ``ready`` to token 0."""
        ws = self.world_size
        self.backend = settings.backend
        self.files = RankFiles(os.path.join(self.root, f"ws{ws}-g{generation}"), ws)
        context = forkserver_context(self.preload)
        self._store = dist.TCPStore(
            "127.0.0.1",
            0,
            None,
            True,
            wait_for_workers=False,
            timeout=timedelta(seconds=settings.start_timeout),
        )
        rewrite = rewritten_modules()
        for rank in range(ws):
            spec = WorkerSpec(
                rank,
                ws,
                settings.backend,
                self._store.port,
                settings.pg_timeout,
                settings.threads,
                self.files.path(rank, "stdout"),
                self.files.path(rank, "stderr"),
                self.files.path(rank, "stacks"),
                rewrite,
                settings.warm_up,
                settings.check_collectives,
            )
            self._spawn(context, spec)
        return 0

    def _spawn(self, context: Any, spec: WorkerSpec) -> None:
        """Start one rank; it kills itself (and its process group) when its life pipe
        closes, that is when the controller closes it or dies."""
        ours, theirs = context.Pipe(duplex=True)
        life_read, life_write = context.Pipe(duplex=False)
        proc = context.Process(
            target=worker_main,
            args=(spec, theirs, life_read),
            name=f"shardcheck-ws{spec.world_size}-rank{spec.rank}",
            daemon=False,  # daemonic processes may not start children (data loader workers)
        )
        proc.start()
        theirs.close()
        life_read.close()
        self._owner[ours] = self._owner[proc.sentinel] = spec.rank
        self.procs.append(proc)
        self.conns.append(ours)
        self._lives.append(life_write)

    def send(self, command: Command) -> int:
        """Send ``command`` down every rank's pipe; its token is its job id."""
        data = encode(command)
        for conn in self.conns:
            try:
                conn.send_bytes(data)
            except OSError:
                pass  # the rank is gone; its sentinel tells the story
        return command.job_id

    def poll(self, token: int, ranks: Sequence[int], timeout: float) -> list[Reply]:
        """Wait on the pipes and sentinels of ``ranks`` for ``timeout`` seconds at most."""
        wanted = set(ranks)
        replies: dict[int, Reply] = {}
        waiting = [obj for obj, rank in self._owner.items() if rank in wanted]
        for obj in wait(waiting, max(0.0, timeout)):
            rank = self._owner[obj]
            if rank not in replies:
                reply = self._receive(rank, obj, token)
                if reply is not None:
                    replies[rank] = reply
        return list(replies.values())

    def _receive(self, rank: int, obj: Any, token: int) -> Reply | None:
        conn = self.conns[rank]
        if obj is not conn:
            if conn.poll():
                return None  # read the last message first; the sentinel stays ready
            return self._crashed(rank)
        try:
            event: Event = decode(conn.recv_bytes())
        except (EOFError, OSError):
            return self._crashed(rank)
        if event.job_id != token:
            return None  # a late reply to an older job
        return Reply(rank, event)

    def _crashed(self, rank: int) -> Reply:
        proc = self.procs[rank]
        proc.join(timeout=2.0)
        return Reply(rank, None, exitcode=proc.exitcode, stacks=self.files.new_stacks(rank))

    def dump_stacks(self, token: int, ranks: Sequence[int]) -> dict[int, StackDump]:
        """Signal the live ``ranks`` (``SIGUSR1``: faulthandler) and read their dumps."""
        live = [rank for rank in ranks if self.procs[rank].exitcode is None]
        for rank in live:
            try:
                os.kill(self.procs[rank].pid, STACK_SIGNAL)
            except ProcessLookupError:
                pass
        return {rank: StackDump(text) for rank, text in self.files.collect_stacks(live).items()}

    def done(self, token: int, outcomes: Sequence[Outcome]) -> None:
        """Read each rank's output files and, with NCCL, each failed rank's last collectives
        from its flight-recorder dump."""
        self.files.read_output(outcomes)
        if self.backend != "nccl":
            return
        prefix = trace_prefix(self.files.directory)
        for outcome in outcomes:
            if not outcome.ok:
                outcome.trace = last_collectives(f"{prefix}{outcome.rank}")

    def recover(self, token: int | None, late: Sequence[int]) -> str | None:
        """Kill every rank with its process group (children included): nothing is lost."""
        for proc in self.procs:
            kill_rank(proc.pid)
        self._forget(join_timeout=5.0)
        return None

    def alive(self) -> bool:
        """Whether no rank process has exited."""
        return all(p.exitcode is None for p in self.procs)

    def taken(self) -> bool:
        """Never: these ranks belong to this pool alone."""
        return False

    def close(self, timeout: float) -> None:
        """Ask the ranks to leave the process group and exit; kill those that do not."""
        if not self.procs:
            return
        self.send(Command(Kind.STOP, 0))
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.recover(None, [])

    def _forget(self, join_timeout: float) -> None:
        deadline = time.monotonic() + join_timeout
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for conn in (*self.conns, *self._lives):
            conn.close()
        self.procs, self.conns, self._lives = [], [], []
        self._owner.clear()
        self._store = None


class LocalRanks:
    """The ``local`` transport as a session uses it (:class:`harness.pool.transport.TransportKind`):
    ranks forked on this machine, one GPU each under NCCL, the forkserver shared by every
    pool of the session."""

    name = "local"

    def gpu_ranks(self, config: HarnessConfig, world_size: int) -> int:
        """Every rank runs on this machine."""
        return world_size

    def open(self, config: HarnessConfig, world_size: int, root: str) -> Transport:
        """Pipes to ``world_size`` ranks forked from the forkserver."""
        return PipeTransport(root, world_size, preload_for(config))

    def warm_up(self, config: HarnessConfig) -> None:
        """Start the forkserver: it imports torch while pytest collects."""
        start_forkserver(preload_for(config))

    def stop(self) -> None:
        """Stop the forkserver."""
        stop_forkserver()


#: the ``local`` transport ([Note: adding a transport] in :mod:`harness.pool.transport`)
KIND = LocalRanks()
