"""Whether this session can run the CUDA-only checks, and the ``environment:`` reason if not.

The CUDA-only checks (CPU offload of parameters, CUDA mixed-precision paths, the rank's CUDA
device) need one GPU per rank and the NCCL backend. The decision is made in the controller,
before any job starts: :func:`cuda_skip_reason` is the pure rule (tested in
``tests/suites_lib/test_cuda_gating.py``), :func:`session_cuda_skip_reason` feeds it this
machine's GPU count and the backend the harness would use, and :func:`cuda_world_max` is the
largest world size the checks may draw. :func:`has_accelerator` tells the checks that need
*no* accelerator (an offload without one must be refused) whether this machine has one.
"""

from __future__ import annotations

import torch

__all__ = [
    "cuda_skip_reason",
    "cuda_world_max",
    "gpu_count",
    "has_accelerator",
    "session_cuda_skip_reason",
]

#: the smallest world the CUDA checks run at: one GPU is enough (world size 1 on NCCL), so a
#: single-GPU machine runs them too; machines with more GPUs draw larger worlds
MIN_WORLD = 1


def cuda_skip_reason(
    gpus: int, backend: str, world_size: int, nproc: int | None = None
) -> str | None:
    """Why a job of ``world_size`` ranks cannot run on CUDA with NCCL here, or None if it can.

    Args:
        gpus: the number of visible CUDA devices (0 without CUDA).
        backend: the process-group backend the ranks would use at ``world_size``
            (``nccl``, ``gloo``, or what ``--backend`` asked for).
        world_size: the ranks the check needs (one GPU each).
        nproc: the session's largest world size (``--nproc``); None: no limit.

    Returns:
        None when there are at least ``world_size`` GPUs, the backend is ``nccl`` and the
        world fits in ``nproc``; else a reason starting with ``environment:`` that says what
        the check needs, what this machine has, and how to get it.

    Raises:
        TypeError: a count that is not an int.
        ValueError: ``gpus < 0``, ``world_size < 1`` or ``nproc < 1``.
    """
    for name, value, low in (("gpus", gpus, 0), ("world_size", world_size, 1), ("nproc", nproc, 1)):
        if value is None and name == "nproc":
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"cuda_skip_reason: {name}={value!r} must be an int.")
        if value < low:
            raise ValueError(f"cuda_skip_reason: {name}={value} must be at least {low}.")
    if nproc is not None and world_size > nproc:
        return (
            f"environment: needs CUDA with {world_size} GPU(s) (one per rank) but --nproc is "
            f"{nproc}; run with --nproc {world_size} or more"
        )
    if gpus >= world_size and backend == "nccl":
        return None
    if gpus >= world_size:
        fix = "run with --backend nccl (or auto)"
    else:
        fix = f"run on a machine with at least {world_size} GPU(s)"
    return (
        f"environment: needs CUDA with {world_size} GPU(s) (one per rank) and the nccl "
        f"backend; this machine has {gpus} GPU(s), backend {backend}; {fix}"
    )


def has_accelerator() -> bool:
    """Whether this machine has an accelerator (CUDA or another torch accelerator)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


def gpu_count() -> int:
    """The number of visible CUDA devices (0 when CUDA is not available)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _session_backend(world_size: int) -> str:
    """The backend the harness's pool would use at ``world_size`` (the asked one if unusable)."""
    from harness.api import current_config, resolve_backend

    asked = current_config().backend
    try:
        return resolve_backend(asked, world_size)
    except ValueError:  # nccl asked for without enough GPUs: the reason says so
        return asked


def session_cuda_skip_reason(world_size: int = MIN_WORLD) -> str | None:
    """:func:`cuda_skip_reason` for this machine and session (controller side, no job).

    Args:
        world_size: the ranks the check needs.
    """
    from harness import max_world_size

    return cuda_skip_reason(
        gpu_count(), _session_backend(world_size), world_size, nproc=max_world_size()
    )


def cuda_world_max() -> int:
    """The largest world size (at least :data:`MIN_WORLD`) the CUDA checks may use here.

    Returns :data:`MIN_WORLD` when even that is not possible (the checks skip first).
    """
    from harness import max_world_size

    best = MIN_WORLD
    for size in range(MIN_WORLD, max_world_size() + 1):
        if session_cuda_skip_reason(size) is None:
            best = size
    return best
