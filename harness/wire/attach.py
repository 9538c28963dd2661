"""What the attach-mode controller and its ranks share: where the store is, and its keys.

Under torchrun every rank worker and the controller talk through torchrun's own store (the
agent's ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``), inside a namespace of this run and
restart. The controller writes numbered commands, each for the first ``k`` ranks (the
world size of its pool: [Note: sub-worlds] in :mod:`harness.pool.transports.store`); each of
those ranks writes its reply under the same number. A rank's watchdog thread bumps a
heartbeat counter, answers stack-dump requests and aborts a job the controller gave up on.
All keys are listed here, in one place:

``to/<seq>``              how many ranks command ``seq`` is for (the first ``k``; the others
                          skip it and wait, leaving the process group they were in)
``cmd/<seq>``             the controller's command number ``seq`` (a pickled ``Command``)
``reply/<seq>/<rank>``    the rank's answer: a pickled ``(Event, stdout, stderr)``
``beat/<rank>``           heartbeat counter, bumped every ``BEAT_INTERVAL`` seconds
``dump/<seq>``            the controller asks every rank still in ``seq`` for its stacks
``stacks/<seq>/<rank>``   the answer: a pickled ``(stacks, stdout, stderr)``
``abort/<seq>``           the controller gave up on ``seq``: interrupt it
``controller``            set (to its exit code) by rank 0 once the controller has exited
``preload``               a pickled ``(environ, modules)``: what a rank sets and imports before
                          its first process group (``AttachStart``), set before the first
                          command; a rank waiting outside the first groups does it meanwhile
``pg/<seq>/...``          the keys of the default process group formed by ``start`` command
                          ``seq`` (a fresh prefix for every group, whatever its size)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

__all__ = [
    "ATTACH_ENV",
    "BEAT_INTERVAL",
    "AttachError",
    "AttachInfo",
    "AttachStart",
    "connect",
    "info_from_env",
    "key",
]

ATTACH_ENV = "SHARDCHECK_ATTACH"
BEAT_INTERVAL = 0.5


class AttachError(RuntimeError):
    """Attach mode cannot start or go on (the message says why and what to do)."""


@dataclass(frozen=True)
class AttachInfo:
    """Where the ranks of one torchrun run are and how to reach them.

    Args:
        host: the store's host (torchrun's ``MASTER_ADDR``).
        port: the store's port (``MASTER_PORT``).
        prefix: the namespace of this run and restart inside the store.
        world_size: the number of ranks (torchrun's ``WORLD_SIZE``).
        local_world_size: ranks per node (``LOCAL_WORLD_SIZE``).
        nnodes: the number of nodes (``GROUP_WORLD_SIZE``).
    """

    host: str
    port: int
    prefix: str
    world_size: int
    local_world_size: int
    nnodes: int

    def to_env(self) -> str:
        """This info as the value of :data:`ATTACH_ENV`."""
        return json.dumps(asdict(self))


@dataclass(frozen=True)
class AttachStart:
    """The ``start`` command's payload: how the ranks form the next process group.

    Args:
        generation: the process group's generation in its pool (a new one after every heal
            or switch back to that world size).
        world_size: the ranks that form it: the first ``world_size`` of torchrun's.
        backend: ``gloo`` or ``nccl``.
        pg_timeout: the process group's initial timeout in seconds.
        threads: torch intra-op threads per rank.
        rewrite: modules to import with pytest's assertion rewriting (name -> path).
        preload: modules a rank imports before it forms its first process group (the local
            forkserver's preload and the strategy's module): a module that binds the default
            group when it is imported (torch's ``ShardedGradScaler`` takes
            ``dist.group.WORLD`` as a default argument) must not keep the first group
            forever, since attach mode's ranks form a new one at every heal and switch.
        warm_up: run one tiny FSDP2 step before answering ``ready``.
        environ: environment variables to set on the ranks first (for example the
            rank-coverage configuration).
    """

    generation: int
    world_size: int
    backend: str
    pg_timeout: float
    threads: int
    rewrite: dict[str, str]
    preload: tuple[str, ...]
    warm_up: bool
    environ: dict[str, str]


def info_from_env(environ: dict[str, str] | None = None) -> AttachInfo | None:
    """The :class:`AttachInfo` the controller was started with, or ``None`` (local mode).

    Raises:
        AttachError: :data:`ATTACH_ENV` is set but malformed.
    """
    env = os.environ if environ is None else environ
    raw = env.get(ATTACH_ENV)
    if not raw:
        return None
    try:
        return AttachInfo(**json.loads(raw))
    except (TypeError, ValueError) as exc:
        raise AttachError(
            f"{ATTACH_ENV}={raw!r} is not attach-mode information ({exc}); it is set by "
            "`python -m harness.attach` for the controller it starts: unset it."
        ) from None


def connect(info: AttachInfo, timeout: float = 60.0) -> Any:
    """A client of torchrun's store, scoped to this run's namespace."""
    try:
        store = dist.TCPStore(
            info.host,
            info.port,
            None,
            False,
            timeout=timedelta(seconds=timeout),
            wait_for_workers=False,
        )
    except (RuntimeError, dist.DistError) as exc:
        raise AttachError(
            f"cannot reach torchrun's store at {info.host}:{info.port} ({exc}); the torchrun "
            "run has ended or the address is not reachable from here."
        ) from None
    return dist.PrefixStore(info.prefix, store)


def key(*parts: object) -> str:
    """A store key from its parts: ``key("reply", 3, 1) == "reply/3/1"``."""
    return "/".join(str(p) for p in parts)
