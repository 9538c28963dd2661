"""An attach-mode rank: one torchrun process serving the controller's commands from the store.

The rank waits for numbered commands (``to/<seq>``, then ``cmd/<seq>``), answers each that is
for it under ``reply/<seq>/<rank>`` with its captured output, and forms a new default process
group whenever the controller says ``start`` (the first time, after a heal, and when another
world size's pool needs the ranks). A command for fewer ranks than this one's rank is skipped:
the rank leaves the process group it was in and waits, idle, for a command that is for it
([Note: sub-worlds] in :mod:`harness.pool.transports.store`). A watchdog thread, with its own
store client, bumps the heartbeat, dumps this rank's Python stacks when the controller asks,
and interrupts a job the controller gave up on (``SIGUSR2`` raises :class:`JobAborted` in the
main thread, which also wakes a ``sleep``). The rank leaves on ``stop``, or once rank 0
reports that the controller has exited.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from harness.rank import coverage as rank_coverage
from harness.rank.isolation import OutputCapture
from harness.rank.runner import (
    JobRunner,
    join_process_group,
    rank_device,
    report_error,
    warm_up_rank,
)
from harness.wire.attach import BEAT_INTERVAL, AttachInfo, AttachStart, connect, key
from harness.wire.fnref import install_rewriting
from harness.wire.protocol import Command, Event, Kind, decode

__all__ = ["AttachedRank", "JobAborted", "sub_world_environ"]

ABORT_SIGNAL = signal.SIGUSR2
IDLE_WAIT = timedelta(seconds=0.5)  # between two looks whether the controller has exited


def sub_world_environ(
    rank: int, local_rank: int, world_size: int, local_world_size: int
) -> dict[str, str]:
    """The launcher variables a rank of a sub-world of ``world_size`` ranks reads: what
    torchrun gives a run of that size on nodes of ``local_world_size`` ranks (``RANK`` and
    ``LOCAL_RANK``, the device, are this process's).

    ``LOCAL_WORLD_SIZE`` is the sub-world's ranks on one node: ``world_size`` while it fits
    on the first node, ``local_world_size`` when it is a whole number of nodes. A size that
    spans nodes without filling them (3 ranks over nodes of 2) has no torchrun counterpart;
    it reads as one node of ``world_size``, the same on every rank (a strategy that sizes
    its mesh from these variables must not build different meshes on different ranks).
    Torchrun's own size gives torchrun's values back.
    """
    if world_size <= local_world_size or world_size % local_world_size:
        local = world_size
    else:
        local = local_world_size
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "ROLE_WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local),
        "GROUP_WORLD_SIZE": str(world_size // local),
    }


class JobAborted(Exception):
    """The controller gave up on this job (a rank hung past the deadline)."""


class AttachedRank:
    """One rank of an attach-mode run.

    Args:
        info: where the store is.
        rank: this process's global rank (torchrun's ``RANK``).
        local_rank: its rank on this node (``LOCAL_RANK``; the CUDA device with NCCL).
    """

    def __init__(self, info: AttachInfo, rank: int, local_rank: int) -> None:
        self.info = info
        self.rank = rank
        self.local_rank = local_rank
        self.store = connect(info)
        self.workdir = tempfile.mkdtemp(prefix=f"shardcheck-attach-rank{rank}-")
        self.capture = OutputCapture(self._path("stdout"), self._path("stderr"))
        self.runner: JobRunner | None = None
        self.joined = False  # whether this process formed a process group before
        self.prepared = False  # whether it set the controller's variables and preloaded
        self.seq = 0  # the command being handled (0: none)
        self.running_job = 0  # the seq of the job running now (0: none)
        self.stopped = threading.Event()
        self._stacks = open(self._path("stacks"), "a+")
        faulthandler.enable(self._stacks, all_threads=True)
        signal.signal(ABORT_SIGNAL, self._abort_handler)

    def _path(self, what: str) -> str:
        return os.path.join(self.workdir, f"rank{self.rank}.{what}")

    def serve(self) -> None:
        """Answer commands until ``stop`` or until the controller has exited."""
        watchdog = threading.Thread(target=self._watch, name="shardcheck-watchdog", daemon=True)
        watchdog.start()
        seq = 1
        try:
            while True:
                members = self._next(seq)
                if members is None:
                    break
                if self.rank >= members:  # a command for the first ranks only: this one waits
                    self._leave()
                    seq += 1
                    continue
                command: Command = decode(self.store.get(key("cmd", seq)))
                if command.kind == Kind.STOP:
                    break
                self.seq = seq
                try:
                    reply = self._handle(seq, command)
                except JobAborted as exc:  # the abort landed just as the job ended
                    reply = Event(Kind.ERROR, command.job_id, self.rank, report_error(exc, 0.0, ""))
                self.capture.flush()
                output = (_read(self._path("stdout")), _read(self._path("stderr")))
                self.store.set(key("reply", seq, self.rank), pickle.dumps((reply, *output)))
                self.seq = 0
                seq += 1
        finally:
            self.stopped.set()
            watchdog.join(timeout=5.0)  # never leave a thread inside the store's C++ client
            if dist.is_initialized():
                dist.destroy_process_group()
            self.capture.flush()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _next(self, seq: int) -> int | None:
        """How many ranks command ``seq`` is for, once it is there; ``None`` once the
        controller has exited."""
        wanted = key("to", seq)
        while True:
            try:  # the store answers as soon as the key is set (a timed-out wait is harmless)
                self.store.wait([wanted], IDLE_WAIT)
                break
            except dist.DistStoreError:
                if self.store.check(["controller"]):
                    return None
                if not self.prepared and self.store.check(["preload"]):
                    self._prepare(*pickle.loads(self.store.get("preload")))
        return int(self.store.get(wanted))

    def _prepare(self, environ: dict[str, str], preload: tuple[str, ...]) -> None:
        """Once per process, before its first process group (and while it waits for one, if
        the first groups are smaller): the controller's variables for the ranks, coverage,
        and the modules to import first (:attr:`AttachStart.preload` says why)."""
        os.environ.update(environ)
        rank_coverage.start_from_env(self.rank)  # no-op unless --rank-coverage
        for module in preload:
            importlib.import_module(module)
        self.prepared = True

    def _leave(self) -> None:
        """Leave the process group this rank is in (a smaller world size's group is
        forming without it); it waits, idle but heartbeating, until one includes it."""
        if dist.is_initialized():
            dist.destroy_process_group()
        self.runner = None

    def _handle(self, seq: int, command: Command) -> Event:
        if command.kind == Kind.START:
            return self._start(command)
        if self.runner is None:
            raise RuntimeError(f"command {str(command.kind)!r} before the process group was formed")
        if command.kind != Kind.JOB:
            return self.runner.handle(command)
        self.running_job = seq
        try:
            return self.runner.handle(command)
        finally:
            self.running_job = 0

    def _start(self, command: Command) -> Event:
        """Form the default process group of the first ``start.world_size`` ranks (leaving
        the old one), through a prefix of the store no other group used. ``ready`` carries
        the seconds it took to leave the old group and join the new one (not the imports
        before the first, nor the warm-up step)."""
        start: AttachStart = command.payload
        began = time.perf_counter()
        self.runner = None
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
            spent = time.perf_counter() - began  # leaving the old group and joining the new
            os.environ.update(start.environ)
            node = self.info.local_world_size
            os.environ.update(sub_world_environ(self.rank, self.local_rank, start.world_size, node))
            if not self.prepared:
                self._prepare(start.environ, start.preload)
            if not self.joined:  # once per process, whichever world size it joins first
                install_rewriting(start.rewrite)
                self.joined = True
            torch.set_num_threads(start.threads)
            device = rank_device(start.backend, self.local_rank)
            pg_store = dist.PrefixStore(key("pg", self.seq), self.store)
            joining = time.perf_counter()
            join_process_group(
                start.backend, pg_store, self.rank, start.world_size, start.pg_timeout, device
            )
            spent += time.perf_counter() - joining
            if start.warm_up:
                warm_up_rank(device)
            self.runner = JobRunner(
                self.rank,
                start.world_size,
                start.backend,
                device,
                self.capture,
                start.pg_timeout,
            )
        except BaseException as exc:
            return Event(Kind.ERROR, command.job_id, self.rank, report_error(exc, 0.0, ""))
        return Event(Kind.READY, command.job_id, self.rank, spent)

    def _abort_handler(self, signum: int, frame: Any) -> None:
        if self.running_job:
            raise JobAborted(
                f"rank {self.rank}: the controller aborted this job after its deadline "
                "(another rank, or this one, hung)"
            )

    def _watch(self) -> None:
        """Heartbeat, stack dumps and aborts, on a store client of its own."""
        store = connect(self.info)
        main = threading.main_thread().ident
        dumped: set[int] = set()
        aborted: set[int] = set()
        while not self.stopped.wait(BEAT_INTERVAL):
            try:
                store.add(key("beat", self.rank), 1)
                seq = self.seq
                if seq and seq not in dumped and store.check([key("dump", seq)]):
                    dumped.add(seq)
                    store.set(key("stacks", seq, self.rank), pickle.dumps(self._dump()))
                running = self.running_job
                if running and running not in aborted and store.check([key("abort", running)]):
                    aborted.add(running)
                    if main is not None:
                        signal.pthread_kill(main, ABORT_SIGNAL)
            except (RuntimeError, dist.DistError):
                return  # the store is gone: torchrun is ending the run

    def _dump(self) -> tuple[str, str, str]:
        self._stacks.flush()
        self._stacks.seek(0, os.SEEK_END)
        start = self._stacks.tell()
        faulthandler.dump_traceback(self._stacks, all_threads=True)
        self._stacks.flush()
        self._stacks.seek(start)
        stacks = self._stacks.read()
        self.capture.flush()
        return stacks, _read(self._path("stdout")), _read(self._path("stderr"))


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
