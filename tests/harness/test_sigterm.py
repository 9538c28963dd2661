"""SIGTERM (a cancelled CI job, ``timeout``) ends a run the way Ctrl-C does: ranks stopped,
the session's temporary directory removed, the report written with ``not run`` checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import harness

REPO = Path(harness.__file__).resolve().parents[1]
PLUGINS = ["-p", "no:shardcheck", "-p", "harness.plugin"]
PLUGINS += ["-p", "no:shardcheck_conformance", "-p", "harness.conformance"]

SUBJECT = """
import os, time
import pytest
from harness import run_on_ranks

def sleep_on_ranks(ctx):
    with open(os.environ["PIDS_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(120)

@pytest.mark.clause("API-1")
def test_before():
    pass

@pytest.mark.clause("API-2")
def test_interrupted():
    run_on_ranks(sleep_on_ranks, world_size=2)

@pytest.mark.clause("API-3")
def test_never_reached():
    pass
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


@pytest.mark.timeout(300)
def test_sigterm_stops_ranks_removes_temp_files_and_writes_the_report(tmp_path: Path) -> None:
    (tmp_path / "test_subject.py").write_text(SUBJECT)
    temp, pids_file, out = tmp_path / "tmp", tmp_path / "pids.txt", tmp_path / "out"
    temp.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(temp),
        "PIDS_FILE": str(pids_file),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable, "-m", "pytest", "test_subject.py", *PLUGINS, "-p", "no:cacheprovider",
        "--nproc", "2", "--conformance-report", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 200
        while len(_pids(pids_file)) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.2)
        ranks = _pids(pids_file)
        assert len(ranks) == 2, "the ranks never started the job"
        assert [p.name for p in temp.iterdir() if p.name.startswith("shardcheck-")]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        stopped_in = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "SIGTERM" in output, output
    assert stopped_in < 30, output
    assert not [p for p in temp.iterdir() if p.name.startswith("shardcheck-")], output
    assert [pid for pid in ranks if _alive(pid)] == [], output
    report = json.loads((out / "report.json").read_text())
    outcomes = {c["id"]: c for c in report["checks"]}
    assert outcomes["test_subject.test_before"]["outcome"] == "passed"
    for name in ("test_interrupted", "test_never_reached"):
        check = outcomes[f"test_subject.{name}"]
        assert check["outcome"] == "not run", check
        assert "interrupted" in check["failure"], check
    assert report["counts"]["not run"] == 2 and report["counts"]["error"] == 0
    assert "| API-3 | not run |" in (out / "report.md").read_text()
    assert "checks: 1 passed, 2 not run" in output


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the point
def test_a_swallowed_sigterm_is_raised_again_before_the_next_test_or_job() -> None:
    """A SIGTERM whose exception Python swallowed (raised inside a ``__del__``) is not lost."""
    from harness.entry import sigterm

    class Swallows:
        def __del__(self) -> None:
            sigterm._on_sigterm(signal.SIGTERM, None)  # raised here, printed, ignored

    previous = signal.getsignal(signal.SIGTERM)
    try:
        obj = Swallows()
        del obj  # "Exception ignored in ... __del__": the run would go on
        with pytest.raises(sigterm.Terminated, match="raised again: the first was swallowed"):
            sigterm.raise_if_terminated()
        sigterm.raise_if_terminated()  # once only: the clean-up is not interrupted twice
    finally:
        signal.signal(signal.SIGTERM, previous)
        sigterm.delivered()
