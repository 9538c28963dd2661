"""``torch.distributed.checkpoint`` (DCP) without arbitrary unpickling, and with plain errors.

DCP reads its ``.metadata`` file with ``pickle.load`` and its non-tensor entries with
``torch.load(weights_only=False)``; both would run arbitrary code from a crafted checkpoint.
CKPT-SEC-1 forbids that, so :class:`SafeReader` unpickles ``.metadata`` with an allow-list
of DCP's own metadata classes first, and :class:`SafeLoadPlanner` checks every non-tensor
entry with ``torch.load(weights_only=True)`` before DCP places it. DCP's
``CheckpointException`` derives from ``BaseException``; :func:`dcp_errors` turns it into a
``RuntimeError`` (CKPT-LOAD-1).
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    create_default_local_load_plan,
)
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem

__all__ = ["SafeLoadPlanner", "SafeReader", "checkpoint_layout", "dcp_errors"]

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("pathlib", "Path"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata: its own dataclasses, torch sizes/dtypes, paths; nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if module == _METADATA_MODULE or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"the checkpoint metadata references {module}.{name}, which is not part of "
            f"torch.distributed.checkpoint's metadata; refusing arbitrary unpickling"
        )


class SafeReader(FileSystemReader):
    """A ``FileSystemReader`` that refuses ``.metadata`` files needing arbitrary unpickling.

    Args:
        path: The checkpoint directory.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._dir = Path(os.fspath(path))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Check the metadata file with an allow-list unpickler, then read it as DCP does.

        Raises:
            pickle.UnpicklingError: If the file references anything outside the allow-list.
        """
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        data = (self._dir / name).read_bytes()
        try:
            _MetadataUnpickler(io.BytesIO(data)).load()
        except pickle.UnpicklingError as exc:
            raise pickle.UnpicklingError(
                f"Refusing to load {str(self._dir)!r}: {exc}. Checkpoints are read without "
                f"arbitrary unpickling (weights_only)."
            ) from exc
        return super().read_metadata(*args, **kwargs)


class SafeLoadPlanner(DefaultLoadPlanner):
    """A ``DefaultLoadPlanner`` whose non-tensor entries must load with ``weights_only=True``.

    It also plans strictly on the current key layout: see
    [Note: no guessing of the pre-2.4 key layout].
    """

    # [Note: no guessing of the pre-2.4 key layout]
    # When the requested keys are a strict subset of the checkpoint's, DefaultLoadPlanner
    # guesses the checkpoint may use torch 2.3's key layout (lists not flattened) and
    # switches to it if any key matches that layout. An FSDP1 rank that holds no part of a
    # tensor drops that tensor from its request (an empty ShardedTensor), which triggers the
    # guess wrongly and then fails on "optimizer.param_groups". Checkpoints written here
    # always use the current layout, and every request is pruned to keys the checkpoint
    # holds, so we plan with that layout directly.
    def create_local_plan(self) -> LoadPlan:
        """Plan the reads of this rank's requested keys (all present in the checkpoint)."""
        assert self.metadata is not None  # set by set_up_planner
        return create_default_local_load_plan(self.state_dict, self.metadata, strict=True)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Verify the entry with ``torch.load(weights_only=True)``, then let DCP place it.

        An entry that ``weights_only`` accepts references only allow-listed globals, so
        DCP's own unpickling of the same bytes runs nothing else.

        Raises:
            pickle.UnpicklingError: If the entry needs arbitrary unpickling.
        """
        start = value.tell()
        try:
            torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise pickle.UnpicklingError(
                f"Refusing to load the checkpoint entry {read_item.dest_index.fqn!r}: it "
                f"needs arbitrary unpickling, and checkpoints are read with weights_only=True "
                f"only. ({str(exc).splitlines()[0]})"
            ) from exc
        value.seek(start)
        super().load_bytes(read_item, value)


def _describe(exc: CheckpointException) -> str:
    parts = []
    for rank, failure in sorted(exc.failures.items()):
        error = failure[0] if isinstance(failure, tuple) else failure
        parts.append(f"rank {rank}: {type(error).__name__}: {error}")
    return "; ".join(parts) or str(exc)


@contextmanager
def dcp_errors(action: str, path: str | os.PathLike[str]) -> Iterator[None]:
    """Re-raise DCP's ``CheckpointException`` (a ``BaseException``) as ``RuntimeError``.

    Args:
        action: What was being done, e.g. "load the sharded checkpoint".
        path: The checkpoint path, for the message.
    """
    try:
        yield
    except CheckpointException as exc:
        raise RuntimeError(
            f"torch.distributed.checkpoint failed to {action} {str(path)!r}: {_describe(exc)}"
        ) from exc


def checkpoint_layout(metadata: Metadata) -> dict[Any, Any]:
    """The nested structure of a DCP checkpoint, leaves being their storage metadata.

    Args:
        metadata: From :meth:`SafeReader.read_metadata`.

    Returns:
        E.g. ``{"model": {"a.weight": TensorStorageMetadata}, "optimizer": {"state":
        {...}, "param_groups": {0: {"lr": BytesStorageMetadata, ...}}}}``; list indices
        appear as integer keys.
    """
    planner_data = metadata.planner_data or {}
    root: dict[Any, Any] = {}
    for flat_key, storage in metadata.state_dict_metadata.items():
        path = planner_data.get(flat_key) or tuple(flat_key.split(".", 1))
        node = root
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = storage
    return root
