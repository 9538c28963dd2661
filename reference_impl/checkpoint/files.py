"""Paths and files: which path the ranks agree on, what is there, and safe writes and reads.

Every decision about the file system is taken on rank 0 and broadcast, so all ranks follow
the same branch (and raise the same error) and never wait for each other in a collective
that one of them skipped. Full checkpoint files are written atomically (a temporary file in
the same directory, then a rename), so an error while writing never leaves half a
checkpoint, nor destroys the previous one.
"""

from __future__ import annotations

import os
import pickle
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

__all__ = [
    "METADATA_FILE",
    "PathPlan",
    "agree_on_path",
    "is_sharded_checkpoint",
    "rank0_run",
    "remove_path",
    "replace_with",
    "safe_torch_load",
    "this_rank",
    "write_file_atomically",
]

METADATA_FILE = "meta.pt"  # the user's other entries in a sharded checkpoint
_DCP_METADATA = ".metadata"  # written by torch.distributed.checkpoint's FileSystemWriter

PathKind = Literal["missing", "file", "sharded", "directory"]
T = TypeVar("T")


def is_sharded_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Tell whether ``path`` is a directory written by ``torch.distributed.checkpoint``."""
    return Path(path).is_dir() and (Path(path) / _DCP_METADATA).is_file()


def _kind(path: Path) -> PathKind:
    if is_sharded_checkpoint(path):
        return "sharded"
    if path.is_dir():
        return "directory"
    if path.exists() or path.is_symlink():
        return "file"
    return "missing"


@dataclass(frozen=True)
class PathPlan:
    """Rank 0's view of a checkpoint path, shared by every rank.

    Attributes:
        path: The path as rank 0 passed it.
        kind: What is at the path on rank 0: "missing", "file", "sharded" (a
            ``torch.distributed.checkpoint`` directory) or "directory" (any other).
        temp: A fresh sibling path for writing before the final rename.
    """

    path: Path
    kind: PathKind
    temp: Path


def _world() -> tuple[int, bool]:
    initialized = dist.is_available() and dist.is_initialized()
    return (dist.get_rank() if initialized else 0), initialized


def this_rank() -> int:
    """This process's rank in the default process group (0 without one)."""
    return _world()[0]


def _broadcast(obj: T) -> T:
    rank, initialized = _world()
    if not initialized:
        return obj
    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def agree_on_path(path: str | os.PathLike[str]) -> PathPlan:
    """Take the checkpoint path from rank 0 and describe what is there (a collective).

    Args:
        path: This rank's path; only rank 0's counts (CKPT-SAVE-2).

    Returns:
        The same plan on every rank.

    Raises:
        TypeError: If ``path`` is not a str or ``os.PathLike``.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"The checkpoint path must be a str or os.PathLike, got {path!r} "
            f"({type(path).__name__})."
        )
    plan = None
    if _world()[0] == 0:
        p = Path(os.fspath(path))
        temp = p.with_name(f".{p.name}.partial-{uuid.uuid4().hex[:12]}")
        plan = (str(p), _kind(p), str(temp))
    agreed = _broadcast(plan)
    assert agreed is not None  # rank 0 always sends one
    return PathPlan(Path(agreed[0]), agreed[1], Path(agreed[2]))


def rank0_run(what: str, fn: Callable[[], T]) -> T | None:
    """Run ``fn`` on rank 0 and tell every rank whether it worked (a collective).

    Args:
        what: What ``fn`` does, for the error the other ranks raise.
        fn: The file operation.

    Returns:
        ``fn()``'s result on rank 0, None elsewhere.

    Raises:
        The error ``fn`` raised, on rank 0; RuntimeError naming it on the other ranks.
    """
    rank, _ = _world()
    result: T | None = None
    error: BaseException | None = None
    if rank == 0:
        try:
            result = fn()
        except Exception as exc:
            error = exc
    message = _broadcast(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if message is not None:
        raise RuntimeError(f"Rank 0 failed to {what}: {message}")
    return result


def remove_path(path: Path) -> None:
    """Remove a file, a link or a directory tree at ``path`` if anything is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def replace_with(temp: Path, path: Path) -> None:
    """Move ``temp`` (file or directory) to ``path``, replacing what is there.

    The old content is moved aside first and deleted only once ``temp`` is in place.
    """
    if path.exists() or path.is_symlink():
        old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:12]}")
        os.replace(path, old)
        os.replace(temp, path)
        remove_path(old)
    else:
        os.replace(temp, path)


def write_file_atomically(obj: Any, temp: Path, path: Path) -> None:
    """``torch.save`` ``obj`` to ``temp``, then move it to ``path`` (replacing it).

    Args:
        obj: What to save.
        temp: A sibling path of ``path`` to write first.
        path: The final path; a file or a sharded checkpoint directory there is replaced.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.save(obj, temp)
        replace_with(temp, path)
    finally:
        if temp.exists():
            temp.unlink()


def safe_torch_load(path: Path, *, mmap: bool = True) -> Any:
    """``torch.load`` with ``weights_only=True`` (CKPT-SEC-1), onto the CPU.

    Args:
        path: A file written by ``torch.save``.
        mmap: Map the file instead of reading it into memory.

    Raises:
        pickle.UnpicklingError: If the file holds objects that need arbitrary unpickling.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise pickle.UnpicklingError(
            f"Refusing to load {str(path)!r}: it holds objects that need arbitrary "
            f"unpickling, and checkpoints are read with torch.load(weights_only=True) only. "
            f"A checkpoint may hold tensors, numbers, strings and containers of them; save "
            f"an object's state_dict() instead of the object. (torch said: "
            f"{str(exc).splitlines()[0]})"
        ) from exc
    except RuntimeError as exc:
        if mmap and "mmap" in str(exc):  # e.g. a legacy (non-zip) file
            return safe_torch_load(path, mmap=False)
        raise
