"""Collective checking on the ranks, and reading collectives out of errors and stacks.

Rank side: :func:`install_checking` makes every process group the rank creates (the default
one and those DeviceMesh/FSDP create inside jobs) a torch ``ProcessGroupWrapper``, which
fingerprints each collective (op, shapes, dtypes) across the group before running it and
raises at once on a mismatch. The c10d debug level is DETAIL only while a group is created,
so nothing else takes its debug paths (see the note below). :class:`CollectiveLog` records every
collective error a job hit (a mismatch among them), also one the job caught and swallowed.

Controller side: :func:`own_fingerprint` reads one rank's collective out of a mismatch
message; :func:`waiting_collective` reads the collective a hung rank waits in, and the
innermost frame of the strategy's code, out of its Python stacks.

[Note: DETAIL only while groups are created] With ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` set for
the whole process, torch 2.13's FSDP1 gathers optimizer state through a debug-logging path
that calls ``torch.cpu.memory_summary`` (missing on CPU), so checks that pass fail. The
wrapper is chosen when a group is created; afterwards it checks every collective whatever
the level, so the level goes back to OFF as soon as the group exists.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

import harness.torch_compat as torch_compat
from harness.verdicts.fsdp2_collectives import fsdp2_collective

__all__ = [
    "Collective",
    "CollectiveLog",
    "checking_installed",
    "install_checking",
    "own_fingerprint",
    "set_checked_timeout",
    "strategy_frame",
    "waiting_collective",
]

MISMATCH = "Detected mismatch between collectives"


@dataclass(frozen=True)
class Collective:
    """One rank's collective, as a verdict names it.

    Args:
        op: the collective (``BARRIER``, ``ALLREDUCE``, or the c10d function waited in).
        shapes: the tensor shapes, as torch prints them (empty when unknown).
        dtypes: the tensor dtypes (empty when unknown).
        frame: the innermost frame of the strategy's (or test's) code that called it.
        via: what entered it when that is not the strategy's own call: FSDP2's collective,
            its function and hook (:mod:`harness.verdicts.fsdp2_collectives`), or ``""``.
    """

    op: str
    shapes: str = ""
    dtypes: str = ""
    frame: str = ""
    via: str = ""

    def describe(self) -> str:
        """``ALLREDUCE shapes=[3, 4] dtypes=Float at strategy.py:12 in load``; ``FSDP2
        all-gather (foreach_all_gather in pre_forward; c10d all_gather_single) at
        strategy.py:30 in training_step`` for one FSDP2 entered."""
        parts = [self.via or self.op]
        if self.shapes:
            parts.append(f"shapes={self.shapes}")
        if self.dtypes:
            parts.append(f"dtypes={self.dtypes}")
        if self.frame:
            parts.append(f"at {self.frame}")
        return " ".join(parts)


@contextmanager
def _detail() -> Iterator[None]:
    debug = torch_compat.c10d_debug()
    previous = debug.get_debug_level()
    debug.set_debug_level(debug.DebugLevel.DETAIL)
    try:
        yield
    finally:
        debug.set_debug_level(previous)


def checking_installed() -> bool:
    """Whether :func:`install_checking` ran in this process."""
    return getattr(torch_compat.new_process_group_helper(), "_shardcheck_checked", False)


def install_checking() -> Callable[[Callable[[], None]], None]:
    """Wrap every process group created from now on; return ``run(init)``, which runs the
    default group's ``init`` under the DETAIL level (see the module note)."""
    if not checking_installed():
        original = torch_compat.new_process_group_helper()

        def checked_helper(*args: Any, **kwargs: Any) -> Any:
            with _detail():
                return original(*args, **kwargs)

        checked_helper._shardcheck_checked = True  # type: ignore[attr-defined]
        torch_compat.replace_new_process_group_helper(checked_helper)

    def run(init: Callable[[], None]) -> None:
        with _detail():
            init()

    return run


def set_checked_timeout(seconds: float) -> None:
    """Set the default group's timeout under the collective checker (torch's
    ``_set_pg_timeout`` only knows unwrapped gloo/NCCL groups and warns otherwise)."""
    for backend in torch_compat.default_group_backends():
        backend._set_default_timeout(timedelta(seconds=seconds))


class CollectiveLog(logging.Handler):
    """Records the collective errors of the current job, from c10d's error log.

    Every c10d collective logs the exception it raises (``_exception_logger``) before
    re-raising it, so an error the job caught (a strategy's ``try``/``except``) is recorded
    as well: ``error`` is the first one (a timeout, a closed connection, a mismatch), and
    ``first`` the collective of the first mismatch, when collectives are checked (later
    errors follow from the first).
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.first: Collective | None = None
        self.message = ""
        self.error = ""

    def attach(self) -> None:
        """Listen to torch's c10d logger."""
        torch_compat.c10d_logger().addHandler(self)

    def clear(self) -> None:
        """Forget the previous job's errors."""
        self.first, self.message, self.error = None, "", ""

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the first mismatch: this rank's collective and the strategy frame."""
        msg: dict[str, Any] = record.msg if isinstance(record.msg, dict) else {}
        error = str(msg.get("error", ""))
        if error and not self.error:
            self.error = f"{msg.get('func_name', '?')}: {error}"
        if self.first is not None or MISMATCH not in error:
            return
        rank = int(msg.get("global_rank", -1))
        own = own_fingerprint(error, rank) or Collective(str(msg.get("func_name", "?")))
        frame = strategy_frame(traceback.extract_stack())
        self.first = Collective(own.op, own.shapes, own.dtypes, frame)
        self.message = error


_FINGERPRINT = r"Rank {rank} is running collective: CollectiveFingerPrint\((?P<body>.*?)\)(?:,|\.)"
_FIELD = re.compile(r"(OpType|TensorShape|TensorDtypes)=(\[[^\]]*\]|[^,)]*)")


def own_fingerprint(message: str, rank: int) -> Collective | None:
    """The collective ``rank`` entered, read from a mismatch message it raised itself.

    (The peer's part of torch's message is unreliable: a fingerprint without tensors is
    decoded by the other side with the wrong op type. Each rank's own part is exact.)
    """
    found = re.search(_FINGERPRINT.format(rank=rank), message, re.S)
    if found is None:
        return None
    fields = dict(_FIELD.findall(found.group("body")))
    op = fields.get("OpType", "?").strip()
    return Collective(op, fields.get("TensorShape", ""), fields.get("TensorDtypes", "").strip())


def _library_roots() -> tuple[str, ...]:
    here = os.path.dirname(os.path.abspath(__file__))
    roots = [os.path.dirname(torch.__file__), here, sysconfig.get_paths()["stdlib"]]
    for name in ("_pytest", "pluggy", "hypothesis"):
        module = sys.modules.get(name)
        if module is not None and module.__file__:
            roots.append(os.path.dirname(module.__file__))
    return tuple(os.path.realpath(r) + os.sep for r in roots)


def _is_strategy_code(filename: str) -> bool:
    return not os.path.realpath(filename).startswith(_library_roots())


def strategy_frame(frames: list[traceback.FrameSummary]) -> str:
    """``file:line in function`` of the innermost frame outside torch, the harness, the
    standard library and the test runner (``frames`` outermost first), or ``""``."""
    for frame in reversed(frames):
        if _is_strategy_code(frame.filename):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return ""


_STACK_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)', re.M)
#: torch's files whose frames on a rank's stack mean it is in a collective: c10d's, and the
#: functional collectives DTensor's redistribute uses (``all_gather_tensor``, ``wait_tensor``)
_COLLECTIVE_FILES = (
    "/distributed/distributed_c10d.py",
    "/distributed/_functional_collectives.py",
    "/distributed/_functional_collectives_impl.py",
    "/distributed/tensor/_collective_utils.py",
)


#: frames of those files whose name says nothing of the collective (``AsyncCollectiveTensor``'s
#: ``wait`` over the ``wait_tensor`` it calls)
_NOT_OP_NAMES = frozenset({"wait"})


def _in_collective_file(filename: str) -> bool:
    return filename.replace(os.sep, "/").endswith(_COLLECTIVE_FILES)


def waiting_collective(stacks: str) -> Collective | None:
    """The collective a rank's faulthandler dump shows it waiting in (a c10d call, or a
    functional collective such as DTensor's ``redistribute`` makes: the outermost such frame
    that names an operation, e.g. ``all_gather_tensor`` over ``wait_tensor``, ``wait_tensor``
    under ``AsyncCollectiveTensor.wait``; or FSDP2's all-gather or reduce-scatter, also while
    it waits for one it issued: :mod:`harness.verdicts.fsdp2_collectives`), with the innermost
    strategy frame that called it; ``None`` when no thread is in one."""
    for block in stacks.split("\n\n"):
        frames = [m.groupdict() for m in _STACK_LINE.finditer(block)]  # innermost first
        ops = [f["name"] for f in frames if _in_collective_file(f["file"])]
        public = [op for op in ops if not op.startswith("_") and op not in _NOT_OP_NAMES]
        op = (public or ops)[-1] if ops else ""
        fsdp2 = fsdp2_collective([(f["file"], f["name"]) for f in frames], op)
        if not op and fsdp2 is None:
            continue
        caller = next((f for f in frames if _is_strategy_code(f["file"])), None)
        where = f"{caller['file']}:{caller['line']} in {caller['name']}" if caller else ""
        if fsdp2 is None:
            return Collective(op, frame=where)
        return Collective(op or fsdp2.function, frame=where, via=fsdp2.describe(op))
    return None
