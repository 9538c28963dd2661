"""The named events exchanged between the controller and the rank workers.

Every message is a small named tuple that carries the job id it belongs to and its
:class:`Kind`, pickled once. The controller drops a reply whose job id is not the one it
waits for, so a late answer to an abandoned job can never be mistaken for the current one.
``Kind`` is a string enum: a kind compares equal to its value (``Kind.JOB == "job"``).

Two transports carry the messages. Local ranks (:mod:`harness.rank.worker`, controller side
:mod:`harness.pool.transports.pipes`) get each message over their pipe
(``Connection.send_bytes``). Attach mode's torchrun ranks (:mod:`harness.rank.attached`,
controller side :mod:`harness.pool.transports.store`) read numbered commands from torchrun's
store (``cmd/<seq>``) and write each answer, with their captured output, as a pickled
``(Event, stdout, stderr)`` under ``reply/<seq>/<rank>`` (the keys are listed in
:mod:`harness.wire.attach`). Both hand ``job``, ``state`` and ``barrier`` to
:class:`harness.rank.runner.JobRunner`, so those kinds mean the same on either transport.

Controller -> worker (:class:`Command`):
    ``start``    torchrun store only: form the default process group of a new generation,
                 leaving the old one (payload: :class:`harness.wire.attach.AttachStart`;
                 job id 0); answer ``ready`` or ``error``. Any other command before the
                 first ``start`` is a protocol error that ends the rank. Pipes have no
                 ``start``: the transport forks new ranks instead.
    ``job``      run a :class:`Job` (payload) and answer ``result`` or ``error``. Over the
                 store, a job the controller aborted answers ``error``.
    ``state``    report the cross-rank state the health check compares (answer ``state``).
    ``barrier``  join a barrier bounded by ``payload`` seconds (answer ``healthy``/``error``).
    ``stop``     leave the process group and exit (job id 0, no payload, no answer). A
                 pipe rank also leaves when its pipe closes; a torchrun rank once rank 0
                 reports that the controller has exited.

Worker -> controller (:class:`Event`):
    ``ready``    the rank joined the process group. Pipes: sent unasked, job id 0, once the
                 new rank joined (payload: its pid). Torchrun store: the answer to ``start``
                 (payload: the seconds forming the group took).
    ``result``   the job returned (payload: :class:`Result`).
    ``error``    the job, a health step, joining the process group (pipes, instead of
                 ``ready``) or ``start`` (store) raised (payload: :class:`ErrorReport`).
    ``state``    answer to ``state`` (payload: a dict of comparable values).
    ``healthy``  the barrier passed (payload: the seconds it took).

A ``result`` or ``error`` of a job also carries the rank's :class:`Usage` after the job
(``Event.usage``): its threads, memory and open files, and whether it asks to be recycled.
"""

from __future__ import annotations

import pickle
import sys
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "Command",
    "ErrorReport",
    "Event",
    "FnRef",
    "Job",
    "Kind",
    "Reply",
    "Result",
    "Usage",
    "decode",
    "encode",
]

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10: what StrEnum does for these members
    from enum import Enum

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)


class Kind(StrEnum):
    """What a :class:`Command` or :class:`Event` is (see the module docstring)."""

    # controller -> worker
    START = "start"  # torchrun store only
    JOB = "job"
    STATE = "state"  # also the worker's answer to it
    BARRIER = "barrier"
    STOP = "stop"
    # worker -> controller
    READY = "ready"
    RESULT = "result"
    ERROR = "error"
    HEALTHY = "healthy"


class Command(NamedTuple):
    """A message from the controller to a worker."""

    kind: Kind
    job_id: int
    payload: Any = None


@dataclass(frozen=True)
class Usage:
    """What a rank process holds after a job (read from ``/proc/self``; see
    :mod:`harness.rank.usage`).

    Args:
        threads: its threads.
        rss_mib: its resident memory, MiB.
        open_files: its open file descriptors.
        cpu_s: the CPU seconds the process has used so far (all its threads).
        recycle: what stayed over the rank's bound after a full collection (``threads``,
            ``open files``, ``memory``), so that it asks to be replaced before the next job;
            ``""`` when nothing did.
    """

    threads: int
    rss_mib: float
    open_files: int
    cpu_s: float = 0.0
    recycle: str = ""


class Event(NamedTuple):
    """A message from a worker to the controller (``usage``: see :class:`Usage`)."""

    kind: Kind
    job_id: int
    rank: int
    payload: Any = None
    usage: Usage | None = None


@dataclass(frozen=True)
class FnRef:
    """How a rank finds the function to run.

    Args:
        module: the function's module name (``__module__``).
        qualname: its qualified name inside the module.
        path: the module's file, used when the module is a test file pytest imported (such
            directories may lack ``__init__.py``).
        rewrite: whether to import that file with pytest's assertion rewriting.
    """

    module: str
    qualname: str
    path: str | None = None
    rewrite: bool = False

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"


@dataclass(frozen=True)
class Job:
    """One call of ``fn(ctx, *args)`` on every rank.

    Args:
        fn: where to find the function.
        args: the pickled argument tuple.
        timeout: the job deadline in seconds; the process-group timeout is set below it.
        tmp_dir: the job's temp directory (same path on every rank).
        factory: the strategy factory, ``module:callable``.
        strategy_options: the ``--strategy-option`` values, merged into ``spec.extra``.
    """

    fn: FnRef
    args: bytes
    timeout: float
    tmp_dir: str
    factory: str
    strategy_options: dict[str, Any]


@dataclass(frozen=True)
class Result:
    """A returned value (pickled on the rank) with the warnings the job emitted (formatted,
    and as ``(category, message, filename, lineno)`` records), and the first collective
    error the job caught (``collective_error``; a broken collective it went on from), and the
    violations recorded after the job's property was tested (``late``: a tuple of
    :class:`harness.verdicts.attribution.LateViolation`, see [Note: clause isolation])."""

    value: bytes
    warnings: str
    elapsed: float
    warning_records: tuple[tuple[str, str, str, int], ...] = ()
    collective_error: str = ""
    late: tuple[Any, ...] = ()


@dataclass(frozen=True)
class ErrorReport:
    """An exception on a rank, in a form that always pickles.

    Args:
        type_name: qualified name of the exception class.
        message: ``str(exc)``.
        traceback: the formatted remote traceback.
        exception: ``pickle.dumps(exc)`` when that worked, else ``None``.
        is_distributed: the exception came from torch.distributed.
        warnings: warnings the job emitted before it raised.
        elapsed: seconds the job ran on this rank.
        desync: the collective (a :class:`harness.verdicts.collectives.Collective`) this rank
            entered when the ranks' collectives did not match, if they did not.
        warning_records: the warnings as ``(category, message, filename, lineno)``.
        collective_error: the first error a c10d collective raised during the job.
        clause: the clause the exception was attributed to on the rank (``harness.clause``),
            or ``""``.
    """

    type_name: str
    message: str
    traceback: str
    exception: bytes | None
    is_distributed: bool
    warnings: str = ""
    elapsed: float = 0.0
    desync: Any = None
    warning_records: tuple[tuple[str, str, str, int], ...] = ()
    collective_error: str = ""
    clause: str = ""


def encode(message: Command | Event) -> bytes:
    """Pickle one message (once, however many ranks receive it)."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Any:
    """Unpickle one message."""
    return pickle.loads(data)


class Reply(NamedTuple):
    """One rank's answer to a command, or (``event`` is ``None``) the news that it is gone.

    Args:
        rank: the rank.
        event: what it answered; ``None`` when the rank crashed or went silent.
        stdout: its output, when the transport carries output with replies.
        stderr: likewise.
        exitcode: a gone rank's exit code, when known.
        detail: why the transport counts the rank as gone, when it knows more than that.
        stacks: the stacks a gone rank left (``faulthandler``'s fatal-error dump).
    """

    rank: int
    event: Event | None
    stdout: str = ""
    stderr: str = ""
    exitcode: int | None = None
    detail: str = ""
    stacks: str = ""
