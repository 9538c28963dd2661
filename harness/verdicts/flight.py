"""NCCL's flight recorder for rank jobs: each rank's last collectives in a hang report.

On NCCL, a rank keeps a ring buffer of its recent collectives (op, sizes, dtypes, state)
when ``TORCH_NCCL_TRACE_BUFFER_SIZE`` is set, and writes it to a per-rank file when a
collective times out (``TORCH_NCCL_DUMP_ON_TIMEOUT``); the process-group timeout sits below
the job deadline, so the file exists when the controller reports the hang. The controller
reads it with :func:`last_collectives`. Gloo has no flight recorder; nothing is set there.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from typing import Any

__all__ = ["TRACE_ENTRIES", "flight_recorder_environ", "last_collectives", "trace_prefix"]

TRACE_ENTRIES = 2000


def trace_prefix(directory: str) -> str:
    """Where the ranks of a pool generation dump their traces (the rank is appended)."""
    return os.path.join(directory, "nccl_trace_rank")


def flight_recorder_environ(prefix: str) -> dict[str, str]:
    """The variables that turn the recorder on for an NCCL rank (set before its first group).

    Args:
        prefix: the dump file's path without the rank (see :func:`trace_prefix`).
    """
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(TRACE_ENTRIES),
        "TORCH_FR_BUFFER_SIZE": str(TRACE_ENTRIES),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DESYNC_DEBUG": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
    }


def _entry_line(entry: Mapping[str, Any]) -> str:
    name = str(entry.get("profiling_name", "?"))
    seq = entry.get("collective_seq_id", "?")
    sizes = entry.get("input_sizes", [])
    dtypes = entry.get("input_dtypes", [])
    state = entry.get("state", "?")
    group = entry.get("process_group", ("?", ""))
    pg = group[0] if isinstance(group, (list, tuple)) and group else group
    return f"#{seq} {name} sizes={sizes} dtypes={dtypes} state={state} group={pg}"


def last_collectives(path: str, count: int = 5) -> str:
    """The last ``count`` collectives of one rank's flight-recorder dump, one per line,
    oldest first (``""`` when there is no readable dump)."""
    try:
        with open(path, "rb") as f:
            dump = pickle.load(f)  # written by torch's own recorder on this machine
    except (OSError, pickle.UnpicklingError, EOFError, ValueError):
        return ""
    entries = dump.get("entries", []) if isinstance(dump, dict) else []
    return "\n".join(_entry_line(e) for e in entries[-count:] if isinstance(e, Mapping))
