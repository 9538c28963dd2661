"""Attach mode under a real torchrun: 4 CPU ranks (gloo), the controller beside rank 0.

Each test starts ``torchrun --nnodes 1 --nproc-per-node 4 -m harness.attach -- pytest ...``,
or two torchrun agents of 2 ranks each on this host standing in for two nodes, on a case file
(``cases/``, not collected on its own) or on a subset of the suites, and reads the
controller's JUnit XML, report and output.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import IO

import pytest

from harness.attach.__main__ import controller_command, info_from_torchrun
from harness.wire.attach import ATTACH_ENV, AttachError, AttachInfo, info_from_env

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "cases"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]


def _attach(
    pytest_args: list[str], tmp_path: Path, timeout: float = 300
) -> tuple[subprocess.CompletedProcess[str], dict[str, tuple[str, str]]]:
    """Run pytest in attach mode on 4 torchrun ranks; return the process and test outcomes."""
    junit = tmp_path / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", ATTACH_ENV))}
    command = [
        *TORCHRUN,
        "--nproc-per-node",
        "4",
        "-m",
        "harness.attach",
        "--",
        "pytest",
        *pytest_args,
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        "-rA",
    ]
    proc = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc, _outcomes(junit) if junit.exists() else {}


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """``{test name: (passed|failed|skipped|error, message)}`` from a JUnit XML file."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kind, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "skipped", "error"):
                kind = {"failure": "failed"}.get(child.tag, child.tag)
                message = child.get("message", "") + (child.text or "")
        found[case.get("name", "")] = (kind, message)
    return found


def _explain(proc: subprocess.CompletedProcess[str]) -> str:
    out, err = proc.stdout[-6000:], proc.stderr[-3000:]
    return f"exit code {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"


def test_attach_mode_reports_raising_and_hanging_ranks_and_heals(tmp_path: Path) -> None:
    proc, outcomes = _attach([str(CASES / "attach_faults.py")], tmp_path)
    assert proc.returncode == 0, _explain(proc)
    passed = [
        "test_every_rank_answers",
        "test_a_raising_rank_is_attributed",
        "test_a_hanging_rank_is_attributed_with_its_stack",
        "test_the_pool_healed_after_the_hang",
        "test_every_smaller_size_is_a_default_group_of_the_first_ranks",
        "test_a_larger_world_size_is_environment[ws2]",
        "test_run_on_ranks_at_a_larger_size_skips_as_environment",
        "test_an_explicit_example_at_a_larger_size_is_dropped",
    ]
    for name in passed:
        assert outcomes.get(name) == ("passed", ""), (name, _explain(proc))
    assert len(outcomes) == len(passed) + 2, sorted(outcomes)
    kind, message = outcomes["test_no_example_fits_is_environment"]
    assert kind == "skipped" and "environment: needs world size" in message, message
    kind, message = outcomes["test_a_larger_world_size_is_environment[ws5]"]
    assert kind == "skipped" and "environment: needs world size 5" in message, message
    assert "world sizes 1 to 4" in message, message
    assert "attach=torchrun(1 node(s) x 4)" in proc.stdout
    # 4 -> 1 -> 3 -> 2 -> 4 -> 2 -> 4 (the sub-world test) and 2 -> 4 (the marker's ws2)
    assert "shardcheck: attach mode switched the ranks' process group" in proc.stdout


def test_attach_mode_passes_a_subset_of_the_suites_with_rank_coverage(tmp_path: Path) -> None:
    report = tmp_path / "report"
    args = [
        "suites/test_training.py",
        "suites/test_sharding.py",
        "suites/test_checkpoint_reshard.py::test_reshard_save_at_a_load_at_b",
        "--hypothesis-profile=ci",
        "--conformance-strict",
        f"--conformance-report={report}",
        f"--rank-coverage-dir={tmp_path / 'coverage'}",
        "--rank-coverage=reference_impl",
    ]
    proc, outcomes = _attach(args, tmp_path, timeout=480)
    assert proc.returncode == 0, _explain(proc)
    passed = [name for name, (kind, _) in outcomes.items() if kind == "passed"]
    skipped = {name: msg for name, (kind, msg) in outcomes.items() if kind == "skipped"}
    assert "test_training_matches_the_unsharded_model" in passed, _explain(proc)
    assert len(passed) >= 8, _explain(proc)
    assert not [k for k, _ in outcomes.values() if k in ("failed", "error")], _explain(proc)
    assert not skipped, skipped  # every world size runs: resharding too (sub-worlds)
    assert len([name for name in passed if "save_at_a_load_at_b" in name]) == 7, passed
    checks = json.loads((report / "report.json").read_text())["checks"]
    assert {c["outcome"] for c in checks} == {"passed"}
    # coverage from every torchrun rank and the controller, combined
    assert "5 processes combined (4 ranks, 1 controller)" in proc.stdout, _explain(proc)
    assert (tmp_path / "coverage" / "coverage.json").is_file()


def test_a_lost_rank_ends_the_run_with_a_report(tmp_path: Path) -> None:
    report = tmp_path / "report"
    args = [str(CASES / "attach_lost_rank.py"), f"--conformance-report={report}"]
    proc, outcomes = _attach(args, tmp_path, timeout=240)
    assert proc.returncode != 0, _explain(proc)
    assert outcomes["test_before_the_crash"] == ("passed", ""), _explain(proc)
    kind, message = outcomes["test_rank_3_dies"]
    assert kind == "failed", _explain(proc)
    assert "rank 3 crashed: no heartbeat" in message, message
    assert "test_never_runs" not in outcomes
    assert "THIS TEST MUST NOT RUN" not in proc.stdout
    assert "Interrupted: shardcheck attach mode: the run cannot go on" in proc.stdout
    # the report says which checks did not run, and why
    checks = {c["id"]: c for c in json.loads((report / "report.json").read_text())["checks"]}
    outcome = {name.rpartition(".")[2]: c["outcome"] for name, c in checks.items()}
    assert outcome == {
        "test_before_the_crash": "passed",
        "test_rank_3_dies": "failed",
        "test_never_runs": "not run",
    }, outcome
    never = next(c for name, c in checks.items() if name.endswith("test_never_runs"))
    assert "the run cannot go on" in never["failure"], never
    assert "## Checks that did not run" in (report / "report.md").read_text()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and everything below it (a "node": its agent and its ranks)."""
    children = subprocess.run(
        ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    for child in children:
        _kill_tree(int(child))
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _two_nodes(
    pytest_args: list[str], tmp_path: Path, rdzv_id: str, env: dict[str, str] | None = None
) -> tuple[list[subprocess.Popen[bytes]], list[IO[str]]]:
    """Start two torchrun agents of 2 ranks each on this host, standing in for two nodes
    (c10d rendezvous on localhost, a shared directory); their output goes to
    ``node<N>.log``, the controller's JUnit XML to ``junit.xml`` in ``tmp_path``."""
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", ATTACH_ENV))}
    env = {**base, **(env or {})}
    endpoint = f"127.0.0.1:{_free_port()}"
    nodes, logs = [], []
    for node in (0, 1):
        command = [
            *TORCHRUN[:-2],
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            rdzv_id,
            "--max-restarts",
            "0",
            "-m",
            "harness.attach",
            "--",
            "pytest",
            *pytest_args,
            "-p",
            "no:cacheprovider",
            f"--shared-dir={shared}",
            f"--junitxml={tmp_path / 'junit.xml'}",
        ]
        logs.append(open(tmp_path / f"node{node}.log", "w"))  # the caller closes them
        nodes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=logs[-1], stderr=logs[-1]))
    return nodes, logs


def _end(nodes: list[subprocess.Popen[bytes]], logs: list[IO[str]]) -> None:
    for proc in nodes:
        if proc.poll() is None:
            _kill_tree(proc.pid)
    for log_file in logs:
        log_file.close()


def test_two_simulated_nodes_run_the_suites_at_every_world_size(tmp_path: Path) -> None:
    """Two torchrun agents of 2 ranks each on this host stand in for two nodes: API-1 and
    API-5 at world sizes 2 (node 0's ranks) and 4 (both nodes), and a checkpoint saved by
    node 0's two ranks and loaded by three ranks of both nodes, pass (about 30 s here
    without other load)."""
    args = [
        "suites/test_api.py",
        "suites/test_checkpoint_reshard.py",
        "-k",
        "setup_environment_reuses or test_collectives or fsdp2-full-2to3",
        "--hypothesis-profile=ci",
        "--conformance-strict",
        f"--conformance-report={tmp_path / 'report'}",
    ]
    nodes, logs = _two_nodes(args, tmp_path, "two-nodes")
    try:
        codes = [proc.wait(timeout=240) for proc in nodes]
    finally:
        _end(nodes, logs)
    log = (tmp_path / "node0.log").read_text()
    assert codes == [0, 0], log + (tmp_path / "node1.log").read_text()
    assert "attach=torchrun(2 node(s) x 2)" in log
    outcomes = _outcomes(tmp_path / "junit.xml")
    assert outcomes and all(kind == "passed" for kind, _ in outcomes.values()), outcomes
    assert "test_reshard_save_at_a_load_at_b[fsdp2-full-2to3]" in outcomes, sorted(outcomes)
    assert len(outcomes) == 7, sorted(outcomes)  # API-1 and API-5 for three families, a reshard
    checks = json.loads((tmp_path / "report" / "report.json").read_text())["checks"]
    assert {c["outcome"] for c in checks} == {"passed"}
    assert "shardcheck: attach mode switched the ranks' process group" in log


def test_a_dead_node_ends_a_two_node_run_with_a_report(tmp_path: Path) -> None:
    """Two torchrun agents of 2 ranks each stand in for two nodes; node 1 is killed mid-job."""
    marker = tmp_path / "marker"
    env = {"SHARDCHECK_TEST_MARKER": str(marker)}
    junit = tmp_path / "junit.xml"
    nodes, logs = _two_nodes([str(CASES / "attach_dead_node.py")], tmp_path, "dead-node", env)
    try:
        deadline = time.monotonic() + 180
        while not marker.exists() and time.monotonic() < deadline:
            assert nodes[0].poll() is None, (tmp_path / "node0.log").read_text()
            time.sleep(0.2)
        assert marker.exists(), (tmp_path / "node0.log").read_text()
        _kill_tree(nodes[1].pid)
        code = nodes[0].wait(timeout=120)
    finally:
        _end(nodes, logs)
    log = (tmp_path / "node0.log").read_text()
    assert code != 0, log
    outcomes = _outcomes(junit)
    kind, message = outcomes["test_a_node_dies_during_a_job"]
    assert kind == "failed", log
    for rank in (2, 3):
        assert f"rank {rank} crashed: no heartbeat" in message, message
    assert "rank 0 ok" not in message  # ranks 0 and 1 were still in the job: hung, not ok
    assert "test_never_runs" not in outcomes
    assert "Interrupted: shardcheck attach mode: the run cannot go on" in log


def test_attach_refuses_to_start_outside_torchrun() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    proc = subprocess.run(
        [sys.executable, "-m", "harness.attach", "--", "pytest", "-q"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "must run under torchrun" in proc.stderr
    assert "RANK" in proc.stderr


def test_controller_command_maps_pytest_and_python_to_this_interpreter() -> None:
    assert controller_command(["--", "pytest", "-x", "suites/"]) == [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "suites/",
    ]
    assert controller_command(["python", "script.py"]) == [sys.executable, "script.py"]
    assert controller_command(["--", "./run.sh", "a"]) == ["./run.sh", "a"]
    with pytest.raises(AttachError, match="usage: torchrun"):
        controller_command(["--"])


def test_torchrun_environment_is_read_and_checked() -> None:
    env = {
        "RANK": "0",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_WORLD_SIZE": "2",
        "MASTER_ADDR": "node1",
        "MASTER_PORT": "29400",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RUN_ID": "job7",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    info = info_from_torchrun(env)
    assert info == AttachInfo("node1", 29400, "shardcheck/job7/1/", 8, 4, 2)
    assert info_from_env({ATTACH_ENV: info.to_env()}) == info
    with pytest.raises(AttachError, match="TORCHELASTIC_USE_AGENT_STORE"):
        info_from_torchrun({**env, "TORCHELASTIC_USE_AGENT_STORE": "False"})
    with pytest.raises(AttachError, match="not attach-mode information"):
        info_from_env({ATTACH_ENV: "{not json"})


def test_attach_settings_are_checked_by_the_plugin(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = AttachInfo("127.0.0.1", 1, "p/", 8, 4, 2)
    pytester.makepyfile("def test_nothing():\n    pass\n")
    monkeypatch.setenv(ATTACH_ENV, info.to_env())
    result = pytester.runpytest_subprocess("--nproc", "8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*across 2 nodes needs --shared-dir DIR*"])
    result = pytester.runpytest_subprocess("--nproc", "4", "--shared-dir", str(pytester.path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--nproc=4 but torchrun started 8 ranks*"])
