"""Offline conversion of a sharded checkpoint into a full one (CKPT-RT-4).

Runs in one process with no process group: every tensor of the sharded checkpoint is read
whole (DCP assembles the shards), ``meta.pt`` is merged in, and the result is written the
way a full save writes it: the model's state dict and each optimizer's named state dict
under their keys, lists of optimizers in the standard integer-keyed form (the trainer
layout), metadata as it is. Nothing is unpickled beyond tensors and plain containers.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from reference_impl.checkpoint.dcp_io import (
    SafeLoadPlanner,
    SafeReader,
    checkpoint_layout,
    dcp_errors,
)
from reference_impl.checkpoint.files import (
    METADATA_FILE,
    is_sharded_checkpoint,
    safe_torch_load,
    write_file_atomically,
)
from reference_impl.checkpoint.rekey import to_standard_optimizer_state

__all__ = ["convert_sharded_to_full"]


def _empty_target(layout: Any) -> Any:
    """A state dict shaped like the checkpoint: empty tensors to read into, None for bytes."""
    if isinstance(layout, TensorStorageMetadata):
        return torch.empty(layout.size, dtype=layout.properties.dtype)
    if not isinstance(layout, dict):
        return None
    children = {key: _empty_target(value) for key, value in layout.items()}
    if children and all(isinstance(k, int) for k in children):
        return [children[i] for i in sorted(children)]
    return children


def _is_optimizer_state(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and "param_groups" in value
        and set(value)
        <= {
            "state",
            "param_groups",
        }
    )


def _as_full(value: Any) -> Any:
    """Give optimizer entries the shape a full save writes."""
    if _is_optimizer_state(value):
        return {"state": value.get("state", {}), "param_groups": value["param_groups"]}
    if isinstance(value, list) and value and all(_is_optimizer_state(v) for v in value):
        return [to_standard_optimizer_state(_as_full(v)) for v in value]
    return value


def convert_sharded_to_full(
    src: str | os.PathLike[str], dst: str | os.PathLike[str]
) -> dict[str, Any]:
    """Convert the sharded checkpoint directory ``src`` into the full checkpoint file ``dst``.

    Needs no process group; run it in a single process (it holds the whole checkpoint in
    memory). The output loads with ``load_checkpoint`` like a checkpoint saved full.

    Args:
        src: A directory written by ``save_checkpoint(..., full=False)``.
        dst: The file to write (an existing file is replaced, atomically).

    Returns:
        The content written (key -> value).

    Raises:
        ValueError: If ``src`` is not a sharded checkpoint.
        IsADirectoryError: If ``dst`` is a directory.
        RuntimeError: If ``torch.distributed.checkpoint`` fails to read ``src``.
        pickle.UnpicklingError: If ``src`` needs arbitrary unpickling.
    """
    src_path, dst_path = Path(os.fspath(src)), Path(os.fspath(dst))
    if not is_sharded_checkpoint(src_path):
        state = (
            "a directory without a .metadata file"
            if src_path.is_dir()
            else ("a file" if src_path.exists() else "missing")
        )
        raise ValueError(
            f"The source {str(src_path)!r} is not a sharded checkpoint ({state}); pass a "
            f"directory written by save_checkpoint(..., full=False)."
        )
    if dst_path.is_dir():
        raise IsADirectoryError(
            f"The destination {str(dst_path)!r} is a directory; pass a file path for the "
            f"full checkpoint."
        )
    layout = checkpoint_layout(SafeReader(src_path).read_metadata())
    content = _empty_target(layout) or {}
    with dcp_errors("read the sharded checkpoint", src_path), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single")
        dcp.load(
            content, storage_reader=SafeReader(src_path), planner=SafeLoadPlanner(), no_dist=True
        )
    content = {key: _as_full(value) for key, value in content.items()}
    meta_path = src_path / METADATA_FILE
    metadata: Mapping[str, Any] = (
        safe_torch_load(meta_path, mmap=False) if meta_path.is_file() else {}
    )
    clash = sorted(set(metadata) & set(content))
    if clash:
        raise ValueError(
            f"The sharded checkpoint {str(src_path)!r} holds {clash} both as sharded state "
            f"and in {METADATA_FILE}; it was not written by save_checkpoint."
        )
    content.update(metadata)
    temp = dst_path.with_name(f".{dst_path.name}.partial-{uuid.uuid4().hex[:12]}")
    write_file_atomically(content, temp, dst_path)
    return content
