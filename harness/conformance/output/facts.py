"""The facts a report records about its run: versions, environment, strategy, reproducers.

The settings in force come from the run's harness session (:func:`harness.run.session.session_of`:
the pool plugin's, or the default one when that plugin is not loaded).
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from importlib import metadata
from typing import Any

import pytest

from harness.config import HarnessConfig, describe_backends
from harness.conformance.outcomes.replay import as_option
from harness.conformance.output.provenance import provenance
from harness.run.session import session_of

__all__ = ["environment", "reproducer", "run", "strategy", "suite_version"]

#: Options a reproducer carries over from the original command line.
_CARRIED = (
    "--nproc",
    "--backend",
    "--strategy",
    "--strategy-option",
    "--rank-timeout",
    "--hypothesis-profile",
    "--hypothesis-seed",
)
_SEED = re.compile(r"--hypothesis-seed=(-?\d+)")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def suite_version() -> str:
    """shardcheck's installed version, or ``0+unknown`` when it is not installed."""
    return _version("shardcheck") or "0+unknown"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def strategy(config: pytest.Config) -> dict[str, Any]:
    """``{"factory": "module:callable", "options": {...}}`` of this run."""
    settings = session_of(config).config
    return {
        "factory": str(settings.strategy),
        "options": _jsonable(dict(settings.strategy_options)),
    }


def _device(backend: str) -> str:
    torch = sys.modules.get("torch")
    if torch is None or "nccl" not in backend or not torch.cuda.is_available():
        return "cpu"
    # device_count does not initialize CUDA in the controller (the ranks own the devices)
    return f"cuda ({torch.cuda.device_count()} devices)"


def environment(config: pytest.Config, world_sizes: Iterable[int]) -> dict[str, Any]:
    """torch, Python, platform, backend, device and the world sizes the checks used.

    Args:
        config: the run's config.
        world_sizes: the sizes the checks that ran declared (``world_size`` marker/param);
            the sizes of the pools the session started are added.
    """
    session = session_of(config)
    settings = session.config
    nproc = settings.nproc
    sizes = sorted(set(world_sizes) | set(session.world_sizes_used()))
    if not sizes:
        sizes = [nproc]
    backend = describe_backends(settings.backend, sizes)
    return {
        "torch": _version("torch"),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "hypothesis": _version("hypothesis"),
        "lightning": _version("lightning"),
        "backend": backend,
        "device": _device(backend),
        "nproc": nproc,
        "world_sizes": sizes,
        "launcher": _launcher(settings),
    }


def _seed(config: pytest.Config) -> int | str | None:
    """``--hypothesis-seed`` as given (an int when it is one), or None."""
    value = config.getoption("hypothesis_seed", None)
    if value is None:
        return None
    text = str(value).strip()
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def run(config: pytest.Config, started_at: datetime, wall_time_s: float) -> dict[str, Any]:
    """How and when the run ran (``report.json``'s ``run``), with every restart of the ranks
    (``heals``: world size, cause, check).

    Args:
        config: the run's config.
        started_at: when the session started (timezone-aware, UTC).
        wall_time_s: seconds from the session's start until the report was built.
    """
    from hypothesis import settings

    return {
        "hypothesis_profile": settings.get_current_profile_name(),
        "hypothesis_seed": _seed(config),
        "started_at": started_at.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "wall_time_s": round(wall_time_s, 1),
        "require_whole_space": bool(config.getoption("require_whole_space", False)),
        # see [Note: heals are counted] in harness.pool.rankpool
        "heals": [heal.as_dict() for heal in session_of(config).heals],
        # per world size, each rank's threads, memory and open files (harness.pool.usage)
        "resources": {str(n): u.as_dict() for n, u in sorted(session_of(config).usage.items())},
        # per world size, why job cutoffs moved on while ranks worked (harness.pool.progress)
        "cutoffs_moved": {str(n): m for n, m in sorted(session_of(config).cutoffs_moved.items())},
        # the command, shardcheck's commit and the machine: what a published figure cites
        **provenance(config),
    }


def _launcher(settings: HarnessConfig) -> str:
    """``shardcheck pool`` (local ranks) or the torchrun shape of an attach-mode run."""
    attach = settings.attach
    if attach is None:
        return "shardcheck pool"
    return f"torchrun attach: {attach.nnodes} node(s) x {attach.local_world_size} ranks"


def _carried(args: Sequence[str]) -> list[str]:
    """The plugin (``-p``) and shardcheck options of the original command line."""
    out: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        name = arg.partition("=")[0]
        takes_next = index + 1 < len(args) and "=" not in arg
        if arg == "-p" and takes_next:
            out += [arg, args[index + 1]]
            index += 1
        elif arg.startswith("-p") and not arg.startswith("--") and len(arg) > 2:
            out.append(arg)
        elif name in _CARRIED and name != "--hypothesis-seed":
            if takes_next:
                out += [arg, args[index + 1]]
                index += 1
            else:
                out.append(arg)
        index += 1
    return out


def _user_seed(args: Sequence[str]) -> str | None:
    for index, arg in enumerate(args):
        if arg.startswith("--hypothesis-seed="):
            return arg.partition("=")[2]
        if arg == "--hypothesis-seed" and index + 1 < len(args):
            return args[index + 1]
    return None


def reproducer(config: pytest.Config, nodeid: str, text: str) -> str:
    """A one-line command that reruns just this check, with Hypothesis' seed and blob, and
    the ``PYTHONPATH`` the run had (so it works when pasted in the same directory).

    Args:
        config: the run's config (its command line supplies ``-p`` and shardcheck options).
        nodeid: the test's node id (relative to the rootdir, where the command runs).
        text: the failure's full text, searched for ``--hypothesis-seed=`` and
            ``@reproduce_failure(...)``.
    """
    args = [str(a) for a in config.invocation_params.args]
    words = ["pytest", nodeid, *_carried(args)]
    if "--strategy" not in {w.partition("=")[0] for w in words}:
        env_factory = os.environ.get("SHARDCHECK_STRATEGY")  # the run's factory came from it
        if env_factory:
            words += ["--strategy", env_factory]
    seed = _SEED.search(text)
    seed_value = seed.group(1) if seed else _user_seed(args)
    if seed_value is not None:
        words.append(f"--hypothesis-seed={seed_value}")
    line = " ".join(shlex.quote(w) for w in words)
    path = os.environ.get("PYTHONPATH")
    if path:  # the factory's module may be importable only through it
        line = f"PYTHONPATH={shlex.quote(path)} {line}"
    attach = session_of(config).config.attach
    if attach is not None:  # the same check, on torchrun ranks of the same shape
        line = (
            f"torchrun --nnodes {attach.nnodes} --nproc-per-node {attach.local_world_size} "
            f"-m harness.attach -- {line}"
        )
    replay = as_option(text)
    if replay:  # the exact failing example, replayed without editing the suite
        line += f" {replay}"
    return line
