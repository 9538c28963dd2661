"""Refusing a world size the machine cannot hold: the rule (fast) and the start-up (pytest)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import harness
from harness.pool.resources import (
    RANK_MEMORY_MB,
    RANKS_PER_CORE,
    Machine,
    OversubscribedError,
    check_world_size,
    estimated_memory_mb,
    this_machine,
)

REPO = Path(harness.__file__).resolve().parents[1]
PLENTY = 1 << 20  # MiB


def test_ranks_up_to_four_per_core_are_accepted() -> None:
    check_world_size(4, "gloo", Machine(cores=1, available_mb=PLENTY))
    check_world_size(8, "gloo", Machine(cores=2, available_mb=PLENTY))
    check_world_size(4, "gloo", Machine(cores=2, available_mb=None))  # memory unknown


def test_more_cpu_ranks_than_four_per_core_are_refused_with_the_numbers() -> None:
    with pytest.raises(OversubscribedError) as info:
        check_world_size(64, "gloo", Machine(cores=2, available_mb=PLENTY))
    message = str(info.value)
    assert "--nproc=64" in message
    assert "64 CPU ranks on 2 core(s)" in message
    assert f"{RANKS_PER_CORE} ranks per core (8)" in message
    assert "use --nproc 8 or less" in message.lower()
    assert "--allow-oversubscribe" in message
    assert isinstance(info.value, ValueError)  # the plugin turns it into a usage error


def test_nccl_ranks_are_not_counted_against_the_cores() -> None:
    check_world_size(8, "nccl", Machine(cores=1, available_mb=PLENTY))


def test_estimated_memory_above_the_available_is_refused() -> None:
    need = estimated_memory_mb(8)
    assert need == 8 * 2 * RANK_MEMORY_MB
    with pytest.raises(OversubscribedError) as info:
        check_world_size(8, "nccl", Machine(cores=64, available_mb=need - 1))
    message = str(info.value)
    assert f"about {need / 1024:.1f} GiB of memory" in message
    assert f"{(need - 1) / 1024:.1f} GiB is available" in message
    assert "use --nproc 7 or less" in message.lower()
    check_world_size(8, "nccl", Machine(cores=64, available_mb=need))


def test_both_problems_are_named_and_the_smaller_fit_wins() -> None:
    with pytest.raises(OversubscribedError) as info:
        check_world_size(64, "gloo", Machine(cores=4, available_mb=2 * 2 * RANK_MEMORY_MB))
    message = str(info.value)
    assert "4 ranks per core (16)" in message and "is available" in message
    assert "use --nproc 2 or less" in message.lower()


def test_no_memory_for_a_single_rank_says_to_free_some() -> None:
    with pytest.raises(OversubscribedError, match=r"Free some memory, or pass --allow-over"):
        check_world_size(1, "gloo", Machine(cores=4, available_mb=10))


def test_this_machine_reads_meminfo_and_a_lower_cgroup_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 24000000 kB\nMemAvailable: 20480000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert this_machine(meminfo, cgroup).available_mb == 20000  # no cgroup files: meminfo
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("1048576\n")
    assert this_machine(meminfo, cgroup).available_mb == 20000  # no limit
    (cgroup / "memory.max").write_text(f"{3 * 1024 * 1024 * 1024}\n")
    assert this_machine(meminfo, cgroup).available_mb == 3 * 1024 - 1
    assert this_machine(tmp_path / "none", tmp_path / "none").available_mb is None
    assert this_machine().cores >= 1


def _timed(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    return done, time.monotonic() - start


def test_too_many_ranks_stop_the_run_at_start_up_and_the_override_lets_it_collect() -> None:
    cores = len(os.sched_getaffinity(0))
    too_many = str(cores * RANKS_PER_CORE + 1)
    # the part of start-up no check can skip: the plugin and the harness session (torch)
    _, imports = _timed("-c", "import harness.plugin, harness.run.session")
    done, seconds = _timed("-m", "pytest", "-p", "no:cacheprovider", "suites/", "--nproc", too_many)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert f"--nproc={too_many} is more than this machine can hold" in done.stderr
    assert f"CPU ranks on {cores} core(s)" in done.stderr
    assert "collected" not in done.stdout  # refused before collection, so before any rank
    assert seconds < 2 * imports + 5, (seconds, imports)  # idle machine: about 2.5 s
    done, _ = _timed(
        "-m", "pytest", "-p", "no:cacheprovider", "suites/test_api.py", "--nproc", too_many,
        "--allow-oversubscribe", "--co", "-q",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tests collected" in done.stdout
