"""``torchrun ... -m harness.attach -- pytest ARGS``: every torchrun process becomes a rank.

Global rank 0 also starts the controller, the given command (normally ``pytest``), as a
process of its own beside it: the controller runs pytest and Hypothesis, never joins a
process group, and talks to the ranks through torchrun's store. When the controller exits,
every rank leaves and rank 0 exits with the controller's exit code, so torchrun's exit code
is pytest's. Rank 0 ignores SIGTERM/SIGINT while the controller runs: when another rank dies,
torchrun stops the workers, and the controller, seeing the silent ranks, still finishes its
report before rank 0 exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from harness.wire.attach import ATTACH_ENV, AttachError, AttachInfo, connect

__all__ = ["controller_command", "main"]

USAGE = (
    "usage: torchrun --nnodes N --nproc-per-node G -m harness.attach -- pytest [PYTEST ARGS]\n"
    "Every torchrun process becomes a rank; rank 0 also starts the command after `--` as the "
    "controller (`pytest ...` runs this interpreter's pytest)."
)
REQUIRED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def controller_command(argv: Sequence[str]) -> list[str]:
    """The controller's command line from ``harness.attach``'s arguments.

    Raises:
        AttachError: no command was given after ``--``.
    """
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        raise AttachError(USAGE)
    if args[0] == "pytest":
        return [sys.executable, "-m", "pytest", *args[1:]]
    if args[0] in ("python", "python3"):
        return [sys.executable, *args[1:]]
    return args


def info_from_torchrun(environ: dict[str, str]) -> AttachInfo:
    """The attach information from the environment torchrun gives its workers.

    Raises:
        AttachError: not started by torchrun, or torchrun's agent does not host the store.
    """
    missing = [name for name in REQUIRED_ENV if name not in environ]
    if missing:
        raise AttachError(
            f"harness.attach must run under torchrun ({', '.join(missing)} not set).\n{USAGE}"
        )
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise AttachError(
            "harness.attach needs the store of torchrun's agent (TORCHELASTIC_USE_AGENT_STORE="
            f"{environ.get('TORCHELASTIC_USE_AGENT_STORE')!r}); start it with torchrun "
            "(torch.distributed.run), not another launcher."
        )
    world = int(environ["WORLD_SIZE"])
    local = int(environ.get("LOCAL_WORLD_SIZE", world))
    run_id = environ.get("TORCHELASTIC_RUN_ID", "none")
    restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return AttachInfo(
        host=environ["MASTER_ADDR"],
        port=int(environ["MASTER_PORT"]),
        prefix=f"shardcheck/{run_id}/{restart}/",
        world_size=world,
        local_world_size=local,
        nnodes=int(environ.get("GROUP_WORLD_SIZE", max(1, world // max(1, local)))),
    )


def _start_controller(command: list[str], info: AttachInfo) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env[ATTACH_ENV] = info.to_env()
    # the store's C++ client logs every refused connection with a stack trace once torchrun has
    # stopped; the controller reports that itself
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    for name in ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_ERROR_FILE"):
        env.pop(name, None)  # the controller is not a rank
    # its own session: torchrun's killpg of rank 0 must not cut the controller's report short
    return subprocess.Popen(command, env=env, start_new_session=True)


def _watch_controller(controller: subprocess.Popen[bytes], info: AttachInfo) -> None:
    """When the controller exits, tell every rank; make sure rank 0 exits with its code."""
    code = controller.wait()
    try:
        connect(info).set("controller", str(code))
    except (AttachError, RuntimeError):
        pass
    leave = threading.Timer(5.0, os._exit, args=(code,))  # rank 0 stuck in a job: leave anyway
    leave.daemon = True
    leave.start()


def main(argv: Sequence[str] | None = None) -> int:
    """Run this torchrun process as a rank (and, on rank 0, start the controller)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        command = controller_command(args)
        info = info_from_torchrun(dict(os.environ))
    except AttachError as exc:
        print(f"harness.attach: {exc}", file=sys.stderr)
        return 2
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    controller = None
    if rank == 0:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        controller = _start_controller(command, info)
        watcher = threading.Thread(target=_watch_controller, args=(controller, info), daemon=True)
        watcher.start()
    from harness.rank.attached import AttachedRank

    AttachedRank(info, rank, local_rank).serve()
    if controller is None:
        return 0
    watcher.join()  # it tells the other ranks; exiting while it talks to the store aborts
    return controller.wait()


if __name__ == "__main__":
    sys.exit(main())
