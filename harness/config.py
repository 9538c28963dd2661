"""The session's settings: :class:`HarnessConfig`, checked as a whole, and what they allow.

:class:`harness.run.session.HarnessSession` holds the settings in force
(:func:`harness.api.configure`); here they are plain values: their defaults (``--nproc`` =
GPUs if at least 2, else 4), their checks, the backend ``auto`` resolves to, and the world
sizes a session can run (``1..--nproc``; in attach mode ``1..N`` for torchrun's ``N`` ranks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.contract import DEFAULT_FACTORY
from harness.entry.defaults import BACKENDS
from harness.wire.attach import AttachInfo

__all__ = [
    "BACKENDS",
    "HarnessConfig",
    "default_nproc",
    "describe_backends",
    "gpu_count",
    "resolve_backend",
    "strategy_factory",
]


def strategy_factory(given: str | None = None) -> str:
    """The strategy factory of a run: ``--strategy`` if given, else the environment variable
    ``SHARDCHECK_STRATEGY``, else the reference's :data:`~harness.contract.DEFAULT_FACTORY`."""
    return given or os.environ.get("SHARDCHECK_STRATEGY") or DEFAULT_FACTORY


def gpu_count() -> int:
    """The CUDA devices this process sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_nproc() -> int:
    """The default ``--nproc``: the number of GPUs if there are at least 2, else 4."""
    gpus = gpu_count()
    return gpus if gpus >= 2 else 4


def resolve_backend(backend: str, world_size: int) -> str:
    """``auto`` -> ``nccl`` when there is one GPU per rank, else ``gloo``.

    Decided per world size: on a machine with fewer GPUs than ``--nproc`` the world sizes
    the GPUs cover run on NCCL and the larger ones on gloo, whose ranks see no GPU (see
    [Note: a rank owns its device] in :mod:`harness.rank.runner`).

    Args:
        backend: ``auto``, ``gloo`` or ``nccl``.
        world_size: the ranks that need a GPU each on this machine (in attach mode, this
            node's ranks).

    Raises:
        ValueError: ``nccl`` was asked for without one GPU per rank.
    """
    gpus = gpu_count()
    if backend == "auto":
        return "nccl" if gpus >= world_size and torch.distributed.is_nccl_available() else "gloo"
    if backend == "nccl" and gpus < world_size:
        raise ValueError(
            f"--backend nccl needs one GPU per rank: world size {world_size} but {gpus} GPU(s) "
            "visible; use --backend gloo (CPU) or a smaller --nproc."
        )
    return backend


def describe_backends(backend: str, world_sizes: list[int]) -> str:
    """The backend each of ``world_sizes`` runs on, in words: ``gloo``, or with ``auto`` on
    a machine with fewer GPUs than ranks ``nccl at world size 1, gloo at 2-4 (gloo ranks see
    no GPU)``."""
    by_size: dict[str, list[int]] = {}
    for size in sorted(world_sizes):
        try:
            chosen = resolve_backend(backend, size)
        except ValueError:
            chosen = backend
        by_size.setdefault(chosen, []).append(size)
    if len(by_size) <= 1:
        return next(iter(by_size), backend)
    parts = [f"{name} at world size {_span(sizes)}" for name, sizes in by_size.items()]
    return ", ".join(parts) + " (gloo ranks see no GPU)"


def _span(sizes: list[int]) -> str:
    """``1``, ``2-4`` or ``1, 3``."""
    if len(sizes) > 1 and sizes == list(range(sizes[0], sizes[-1] + 1)):
        return f"{sizes[0]}-{sizes[-1]}"
    return ", ".join(map(str, sizes))


@dataclass
class HarnessConfig:
    """Session-wide settings (the plugin fills them from the command line).

    Args:
        nproc: the largest world size a job may use (``--nproc``).
        backend: ``auto``, ``gloo`` or ``nccl`` (``--backend``).
        rank_timeout: the largest job deadline in seconds (``--rank-timeout``); jobs get
            deadlines learned from their check's passing jobs below it.
        strategy: the strategy factory, ``module:callable`` (``--strategy``).
        strategy_options: ``--strategy-option`` values, passed in ``spec.extra``.
        threads: torch intra-op threads per rank.
        failure_grace: seconds the other ranks get to finish after one rank failed.
        transport: how the pools reach their ranks, a name registered in
            :data:`harness.pool.transports.TRANSPORTS` (``local``: ranks forked here;
            ``torchrun``: attach mode, with ``attach`` set).
        attach: the torchrun run this controller drives (attach mode), else ``None``.
        shared_dir: where job directories go (``--shared-dir``; required on several nodes).
        check_collectives: check every job's collectives across ranks
            (``--check-collectives``); otherwise only a failed job's replay and the rest of
            its check are checked (:mod:`harness.verdicts.collectives`).
    """

    nproc: int = field(default_factory=default_nproc)
    backend: str = "auto"
    rank_timeout: float = 120.0
    strategy: str = field(default_factory=strategy_factory)
    strategy_options: dict[str, Any] = field(default_factory=dict)
    threads: int = 1
    failure_grace: float = 3.0
    transport: str = "local"
    attach: AttachInfo | None = None
    shared_dir: str | None = None
    check_collectives: bool = False

    def check(self) -> None:
        """Refuse settings that cannot work together.

        Raises:
            ValueError: a value is out of range (the message names it and the fix).
        """
        if self.nproc < 1:
            raise ValueError(f"--nproc={self.nproc} must be at least 1.")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend={self.backend!r} is not one of {', '.join(BACKENDS)}.")
        if not self.rank_timeout > 0:
            raise ValueError(
                f"--rank-timeout={self.rank_timeout} must be a positive number of seconds."
            )
        if (self.transport == "torchrun") != (self.attach is not None):
            raise ValueError(
                f"transport {self.transport!r} with attach information "
                f"{'set' if self.attach is not None else 'missing'}: the torchrun transport "
                "and attach-mode information go together (`python -m harness.attach` sets both)."
            )
        if self.attach is not None:
            self._check_attach(self.attach)
        elif self.backend == "nccl":
            resolve_backend("nccl", self.nproc)
        if self.shared_dir is not None and not os.path.isdir(self.shared_dir):
            raise ValueError(
                f"--shared-dir={self.shared_dir!r} is not a directory; create it on a "
                "filesystem every node mounts at the same path."
            )

    def _check_attach(self, info: AttachInfo) -> None:
        if self.nproc != info.world_size:
            raise ValueError(
                f"--nproc={self.nproc} but torchrun started {info.world_size} ranks; in attach "
                "mode the world size is torchrun's: drop --nproc or make them equal."
            )
        if info.nnodes > 1 and self.shared_dir is None:
            raise ValueError(
                f"attach mode across {info.nnodes} nodes needs --shared-dir DIR on a filesystem "
                "every node mounts at the same path (checkpoint jobs write there)."
            )
        if self.backend == "nccl" and gpu_count() < info.local_world_size:
            raise ValueError(
                f"--backend nccl needs one GPU per rank: {info.local_world_size} ranks on this "
                f"node but {gpu_count()} GPU(s) visible; use --backend gloo."
            )

    def max_world_size(self) -> int:
        """The largest world size a session may run (``--nproc``, or torchrun's size)."""
        return self.attach.world_size if self.attach is not None else self.nproc

    def world_sizes(self) -> list[int]:
        """Every world size a session can run: ``1..--nproc``; in attach mode ``1..N`` for
        torchrun's ``N`` ranks (a job at size ``k`` runs on the first ``k``)."""
        return list(range(1, self.max_world_size() + 1))

    def unavailable_reason(self, world_size: int) -> str | None:
        """Why ``world_size`` cannot run (``environment: ...``), or ``None``."""
        if self.attach is not None:
            if world_size <= self.attach.world_size:
                return None
            return (
                f"environment: needs world size {world_size} but this attach-mode run has "
                f"torchrun's {self.attach.world_size} ranks (world sizes 1 to "
                f"{self.attach.world_size}); start torchrun with {world_size} ranks or more"
            )
        if world_size <= self.nproc:
            return None
        return (
            f"environment: needs world size {world_size} but --nproc is {self.nproc}; "
            f"run with --nproc {world_size} or more"
        )
