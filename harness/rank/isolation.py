"""Keeping one job from leaking into the next inside a rank process.

:class:`Baseline` is the rank's state right after it joined the process group. Before each
job :meth:`Baseline.reset` restores it (seeds, default dtype and device, grad mode,
deterministic flags, thread count, environment variables, cwd, warning filters); after each
job :meth:`Baseline.cleanup` destroys the process groups the job created and frees them.
Every step is a cheap comparison first, so an empty job stays well under a millisecond.

[Note: freeing the destroyed groups] ``destroy_process_group`` only drops a group from
torch's registries. The group object itself (for gloo, with its worker and TCP-loop threads)
lives on while anything references it, and a job's modules, meshes and hooks reference it
through reference cycles that only Python's full (generation 2) collection frees. In a rank
process, which holds torch's many long-lived objects, that collection is rare: over a
``nightly`` run (thousands of jobs) one rank held 236 dead gloo groups and 710 threads, and
the machine spent 80% of its time in the kernel. So the rank freezes what exists when it
joins (``gc.freeze``: never collected, never traversed again) and runs a full collection after
every :data:`COLLECT_EVERY` jobs that created groups: the dead groups of that many jobs at most
are alive at once, and the collection, which walks everything the rank created since it
joined (the suites' imports included), costs little per job.

:class:`OutputCapture` points the rank's stdout/stderr file descriptors at two files the
controller reads after the job (so C++ output and output of a crashed rank are kept too).
"""

from __future__ import annotations

import gc
import os
import random
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

import harness.torch_compat as torch_compat

__all__ = [
    "Baseline",
    "OutputCapture",
    "capture_warnings",
    "cross_rank_state",
    "format_warnings",
    "warning_records",
]

JOB_SEED = 0

#: jobs that created process groups between two full collections (see
#: [Note: freeing the destroyed groups])
COLLECT_EVERY = 8


class Baseline:
    """The rank's state to return to before every job (taken once, after joining)."""

    def __init__(self) -> None:
        self.environ = dict(os.environ._data)  # type: ignore[attr-defined]
        self.cwd = os.getcwd()
        self.filters = list(warnings.filters)
        self.threads = torch.get_num_threads()
        self.groups = torch_compat.process_groups()
        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        gc.collect()
        gc.freeze()  # see [Note: freeing the destroyed groups]
        self.uncollected = 0  # jobs that created groups since the last full collection

    def reset(self) -> None:
        """Restore the baseline and reseed every generator with the same seed on all ranks."""
        if os.environ._data != self.environ:  # type: ignore[attr-defined]
            _restore_environ(self.environ)
        self._restore_cwd()
        if warnings.filters != self.filters:
            warnings.filters[:] = self.filters  # type: ignore[index]
            warnings._filters_mutated()  # type: ignore[attr-defined]
        random.seed(JOB_SEED)
        np = sys.modules.get("numpy")
        if np is not None:
            np.random.seed(JOB_SEED)
        torch.random.default_generator.manual_seed(JOB_SEED)
        if self.cuda:
            torch.cuda.manual_seed_all(JOB_SEED)
        if torch.get_default_dtype() is not torch.float32:
            torch.set_default_dtype(torch.float32)
        if torch.get_default_device().type != "cpu":
            torch.set_default_device(None)
        if not torch.is_grad_enabled():
            torch.set_grad_enabled(True)
        if torch.are_deterministic_algorithms_enabled():
            torch.use_deterministic_algorithms(False)
        if torch.is_anomaly_enabled():
            torch.autograd.set_detect_anomaly(False)
        if torch.get_float32_matmul_precision() != "highest":
            torch.set_float32_matmul_precision("highest")
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    def _restore_cwd(self) -> None:
        try:
            if os.getcwd() == self.cwd:
                return
        except FileNotFoundError:  # the job's cwd was removed
            pass
        os.chdir(self.cwd)

    def cleanup(self) -> None:
        """Leave the job's cwd (its directory is removed next) and destroy the process
        groups (and so the device meshes' groups) the job created."""
        self._restore_cwd()
        if not dist.is_initialized():
            return
        created = torch_compat.created_process_groups(self.groups)
        for pg in created:
            try:
                dist.destroy_process_group(pg)
            except Exception:  # a broken group: drop it from the registry anyway
                torch_compat.drop_process_group(pg)
        torch_compat.clear_mesh_stack()
        if created:  # DTensor caches meshes that compare equal but name the destroyed groups
            torch_compat.clear_sharding_cache()
            self.uncollected += 1
            if self.uncollected >= COLLECT_EVERY:  # see [Note: freeing the destroyed groups]
                self.collect()

    def collect(self) -> None:
        """A full collection now: frees the groups of the jobs since the last one."""
        gc.collect()
        self.uncollected = 0


def _restore_environ(saved: dict[bytes, bytes]) -> None:
    current = os.environ._data  # type: ignore[attr-defined]
    for key in [k for k in current if k not in saved]:
        os.unsetenv(key)
        del current[key]
    for key, value in saved.items():
        if current.get(key) != value:
            os.putenv(key, value)
            current[key] = value


def cross_rank_state() -> dict[str, Any]:
    """State that must be equal on every rank for the pool to stay usable."""
    state: dict[str, Any] = {"initialized": dist.is_initialized()}
    if dist.is_initialized():
        state.update(torch_compat.group_registry_state())
    return state


@contextmanager
def capture_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Record the warnings of one job (deprecations included, as pytest shows them)."""
    with warnings.catch_warnings(record=True) as records:
        warnings.filterwarnings("always", category=DeprecationWarning)
        warnings.filterwarnings("always", category=PendingDeprecationWarning)
        yield records


def warning_records(
    records: list[warnings.WarningMessage],
) -> tuple[tuple[str, str, str, int], ...]:
    """The recorded warnings as ``(category, message, filename, lineno)`` tuples."""
    return tuple((w.category.__name__, str(w.message), w.filename, w.lineno) for w in records)


def format_warnings(records: list[warnings.WarningMessage]) -> str:
    """The recorded warnings as ``warnings.formatwarning`` prints them."""
    return "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in records
    )


class OutputCapture:
    """Send fd 1 and fd 2 of this process to two append-mode files, emptied per job.

    Args:
        stdout_path: file that receives stdout.
        stderr_path: file that receives stderr.
    """

    def __init__(self, stdout_path: str, stderr_path: str) -> None:
        self.fds = []
        for path, target in ((stdout_path, 1), (stderr_path, 2)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
            os.dup2(fd, target)
            os.close(fd)
            self.fds.append(target)

    def start_job(self) -> None:
        """Empty both files: what follows belongs to the new job."""
        self.flush()
        for fd in self.fds:
            os.ftruncate(fd, 0)

    def flush(self) -> None:
        """Flush Python's buffers so the controller sees everything written so far."""
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
