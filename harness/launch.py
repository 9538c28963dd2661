"""How rank processes are made and unmade.

Ranks are forked from multiprocessing's forkserver, which imports torch and the
distributed/FSDP/DTensor/checkpoint modules once (``PRELOAD``), so a rank is ready to join a
process group a few milliseconds after it is forked (plain ``spawn`` would import torch in
every rank: about twice as slow here). Computing anything in the forkserver is avoided:
thread pools started there do not survive ``fork``. Each rank leads its own process group,
so :func:`kill_rank` takes whatever the rank started with it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from harness.worker import WorkerSpec, worker_main

__all__ = ["PRELOAD", "forkserver_context", "kill_rank", "spawn_rank"]

PRELOAD = (
    "torch",
    "numpy",
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch.distributed.fsdp._fully_shard",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.device_mesh",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper",
    "torch._dynamo",  # imported lazily by the first FSDP2 step: 2+ s on the first job
    "torch.optim",
    "numpy.random",
    "harness.worker",
)


def forkserver_context(extra_preload: Sequence[str] = ()) -> Any:
    """The forkserver context, preloading torch's distributed stack (before it starts)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*PRELOAD, *extra_preload])
    return context


def spawn_rank(context: Any, spec: WorkerSpec) -> tuple[Any, Connection, Connection]:
    """Start one rank; return its process, its command pipe and the life pipe's write end.

    The rank kills itself (and its process group) when the life pipe closes, that is when
    the controller closes it or dies.
    """
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
    return proc, ours, life_write


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
