"""The rank process: join the process group once, then run jobs until told to stop.

A worker is forked from the forkserver (torch and the distributed modules already
imported), becomes the leader of its own process group (so the controller can kill it with
everything it started), points stdout/stderr at per-rank files, arms ``faulthandler`` (fatal
signals dump Python stacks to a per-rank file; a thread dumps them there on ``SIGUSR1``),
joins the default process group through the controller's store, and then serves
:mod:`harness.wire.protocol` commands.
A watchdog thread kills the rank's process group when the controller's end of the life
pipe closes, so a dead controller never leaves ranks behind. The controller's side is
:mod:`harness.pool.transports.pipes`; the commands are run by
:class:`harness.rank.runner.JobRunner`.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
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
from harness.verdicts.collectives import install_checking
from harness.verdicts.flight import trace_prefix
from harness.wire.fnref import install_rewriting
from harness.wire.protocol import Command, Event, Kind, decode, encode

__all__ = ["END_OF_DUMP", "STACK_SIGNAL", "WorkerSpec", "launcher_environ", "worker_main"]

STACK_SIGNAL = signal.SIGUSR1
#: the line a rank writes after each stack dump it was asked for: the pool reads a dump only
#: once it is whole (see [Note: a dump is read whole] in harness.pool.transports.pipes)
END_OF_DUMP = "-- end of the stack dump --\n"


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a rank needs to start.

    Args:
        rank: this rank.
        world_size: the pool's world size.
        backend: ``gloo`` or ``nccl``.
        store_port: port of the controller's TCPStore on 127.0.0.1.
        pg_timeout: initial process-group timeout in seconds (set per job later).
        threads: torch intra-op threads for this rank.
        stdout_path: per-rank stdout capture file.
        stderr_path: per-rank stderr capture file.
        stacks_path: per-rank file for faulthandler's stack dumps.
        rewrite: modules (name -> path) to import with pytest's assertion rewriting.
        warm_up: run :func:`harness.rank.warmup.tiny_fsdp2_step` once before reporting ready.
        check_collectives: wrap every process group in torch's collective checker
            (:mod:`harness.verdicts.collectives`), so ranks entering different collectives raise.
    """

    rank: int
    world_size: int
    backend: str
    store_port: int
    pg_timeout: float
    threads: int
    stdout_path: str
    stderr_path: str
    stacks_path: str
    rewrite: dict[str, str] = field(default_factory=dict)
    warm_up: bool = True
    check_collectives: bool = False


def worker_main(spec: WorkerSpec, conn: Connection, life: Connection) -> None:
    """Entry point of a rank process (the target of ``multiprocessing.Process``)."""
    # before any thread starts, so that every thread inherits it: see [Note: stack dumps
    # hold the GIL]
    signal.pthread_sigmask(signal.SIG_BLOCK, {STACK_SIGNAL})
    own_group = _become_group_leader()
    rank_coverage.start_from_env(spec.rank)  # no-op unless --rank-coverage
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_controller(life, own_group)
    capture = OutputCapture(spec.stdout_path, spec.stderr_path)
    stacks = open(spec.stacks_path, "a")
    faulthandler.enable(stacks, all_threads=True)
    _dump_stacks_on_signal(stacks)
    try:
        rank = _Rank(spec, conn, capture)
    except BaseException as exc:
        conn.send_bytes(encode(Event(Kind.ERROR, 0, spec.rank, report_error(exc, 0.0, ""))))
        capture.flush()
        os._exit(1)
    conn.send_bytes(encode(Event(Kind.READY, 0, spec.rank, os.getpid())))
    rank.serve()


def _become_group_leader() -> bool:
    try:
        os.setpgid(0, 0)
    except OSError:
        return False
    return os.getpgid(0) == os.getpid()


def _watch_controller(life: Connection, own_group: bool) -> None:
    def watch() -> None:
        try:
            life.recv_bytes()
        except (EOFError, OSError):
            pass
        if own_group:
            os.killpg(0, signal.SIGKILL)
        os._exit(70)

    threading.Thread(target=watch, name="shardcheck-watchdog", daemon=True).start()


def _dump_stacks_on_signal(stacks: Any) -> None:
    """Write the stacks of all threads to ``stacks`` at each ``STACK_SIGNAL``, from a thread
    that holds the GIL.

    [Note: stack dumps hold the GIL] ``faulthandler.register(signal, all_threads=True)``
    dumps from inside the C signal handler, without the GIL, and so walks the frames of a
    thread that may be half-way through pushing or popping one (a data-stack chunk just
    freed): it reads freed memory and the rank dies by SIGSEGV (CPython gh-116008). The
    stall probe signals every rank still in a job after 3 s, every 2 s; the first job on
    fresh ranks (imports, no warm-up) is the one that runs that long most often, and it is
    import-heavy, so a false "killed by SIGSEGV" came now and then, its "fatal error dump"
    being the half-written sample (cut mid-line) and then "Fatal Python error: Segmentation
    fault" with no stack after it. Measured with Python 3.11.7, ranks signalled at 500 Hz
    through 25 rounds of CKPT-SAVE-6's rank-killed case: dumped from the handler, a rank
    died by SIGSEGV in both runs (a check failed at rounds 10 and 24; once both ranks, 0.3 s
    into the first job of fresh ranks); dumped as below, 25 of 25 passed. Here the signal is
    blocked in every thread (the mask is set before the first thread starts; threads and
    child processes inherit it) and taken by ``sigwait`` in this thread, which dumps with
    ``faulthandler.dump_traceback`` while holding the GIL: every other thread is then between
    two bytecodes or in C code, its frames complete (attach mode's ranks dump the same way,
    from their store thread). The cost: a thread that holds the GIL in C code is sampled
    only once it lets go (a c10d collective releases it); till then the probe gets no dump
    and does not call the rank stuck.
    """

    def dump_stacks() -> None:
        while True:
            signal.sigwait({STACK_SIGNAL})
            faulthandler.dump_traceback(stacks, all_threads=True)
            os.write(stacks.fileno(), END_OF_DUMP.encode())

    threading.Thread(target=dump_stacks, name="shardcheck-stacks", daemon=True).start()


class _Rank:
    """One local rank: joins the default process group, then answers commands on its pipe."""

    def __init__(self, spec: WorkerSpec, conn: Connection, capture: OutputCapture) -> None:
        self.spec = spec
        self.conn = conn
        os.environ.update(launcher_environ(spec.rank, spec.world_size))
        torch.set_num_threads(spec.threads)
        install_rewriting(spec.rewrite)
        device = rank_device(spec.backend, spec.rank)  # one node: local rank = rank
        store = dist.TCPStore(
            "127.0.0.1",
            spec.store_port,
            spec.world_size,
            is_master=False,
            timeout=timedelta(seconds=max(spec.pg_timeout, 30.0)),
        )
        trace = trace_prefix(os.path.dirname(spec.stacks_path))
        args = (spec.backend, store, spec.rank, spec.world_size, spec.pg_timeout, device, trace)
        if spec.check_collectives:
            install_checking()(lambda: join_process_group(*args))
        else:
            join_process_group(*args)
        if spec.warm_up:
            warm_up_rank(device)
        self.runner = JobRunner(
            spec.rank,
            spec.world_size,
            spec.backend,
            device,
            capture,
            spec.pg_timeout,
            spec.check_collectives,
        )

    def serve(self) -> None:
        """Answer commands until ``stop`` or until the controller's pipe closes."""
        while True:
            try:
                command: Command = decode(self.conn.recv_bytes())
            except (EOFError, OSError):
                break
            if command.kind == Kind.STOP:
                break
            self.conn.send_bytes(encode(self.runner.handle(command)))
        self.runner.capture.flush()
        if dist.is_initialized():
            dist.destroy_process_group()


def launcher_environ(rank: int, world_size: int) -> dict[str, str]:
    """The variables torchrun gives a rank of a one-node run, for strategies that read them
    (``LOCAL_RANK`` picks the CUDA device; ``CUDA_VISIBLE_DEVICES`` is inherited as it is)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
    }
