"""The pytest plugin end to end: pytest runs in a subprocess on small test files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

import harness

REPO = str(Path(harness.__file__).resolve().parent.parent)
INSTALLED = any(ep.value == "harness.plugin" for ep in entry_points(group="pytest11"))
PLUGIN = [] if INSTALLED else ["-p", "harness.plugin"]

HEADER = """
import os, signal, sys, time
import pytest
import torch
import torch.distributed as dist
from harness import run_on_ranks

def record_pids(ctx):
    with open(os.environ["PIDS_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return os.getpid()
"""


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PIDS_FILE", str(pytester.path / "pids.txt"))
    monkeypatch.delenv("SHARDCHECK_STRATEGY", raising=False)
    for var in ("CI", "TF_BUILD", "GITHUB_ACTIONS", "BUILDKITE", "CIRCLECI", "GITLAB_CI"):
        monkeypatch.delenv(var, raising=False)  # Hypothesis loads its `ci` profile on CI

    def run(source: str, *args: str) -> pytest.RunResult:
        pytester.makepyfile(test_subject=HEADER + source)
        return pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", *args, timeout=240)

    return run


def rank_pids(pytester: pytest.Pytester) -> list[int]:
    path = pytester.path / "pids.txt"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


CRASH = """
def crash_rank_one(ctx):
    print(f"rank {ctx.rank} about to act", flush=True)
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return ctx.rank

def test_crash():
    run_on_ranks(crash_rank_one, world_size=2)

def test_after_crash():
    run_on_ranks(record_pids, world_size=2)
"""


def test_crashing_rank_fails_the_test_and_the_next_test_passes(run, pytester) -> None:
    result = run(CRASH, "--rank-timeout", "30")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*RankFailure: job 1: test_subject:crash_rank_one at world size 2: rank 1 crashed*",
            "*rank 1 crashed: killed by SIGSEGV (exit code -11)*",
            "*Captured rank 0 stdout call*",
            "rank 0 about to act",
        ]
    )
    pids = rank_pids(pytester)
    assert len(pids) == 2
    assert not any(alive(pid) for pid in pids)


HANG = """
def spin_on_rank_zero(ctx):
    while ctx.rank == 0:
        pass
    return ctx.rank

def test_hang():
    run_on_ranks(spin_on_rank_zero, world_size=2)

def test_after_hang():
    run_on_ranks(record_pids, world_size=2)

def test_selected_profile_is_ours():
    from hypothesis import settings
    assert settings.get_current_profile_name() == "ci"
    assert settings.default.max_examples == 6 and settings.default.derandomize
"""


def test_hanging_rank_is_reported_with_its_stack(run, pytester) -> None:
    result = run(HANG, "--rank-timeout", "3", "--hypothesis-profile=ci")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "*rank 0 hung: still running at the deadline (3.0 s)*",
            "*Python stacks:*",
            '*File "*test_subject.py", line * in spin_on_rank_zero*',
        ]
    )
    assert not any(alive(pid) for pid in rank_pids(pytester))


OUTPUT_AND_MARKERS = """
import warnings
from harness import max_world_size
import helper_checks

def helper_assert(ctx):
    helper_checks.check_config({"lr": 0.1 * (ctx.rank + 1)})

def test_helper_assert_is_rewritten_on_ranks():
    run_on_ranks(helper_assert, world_size=2)

def chatty(ctx):
    print(f"hello from rank {ctx.rank}")
    print(f"complaint from rank {ctx.rank}", file=sys.stderr)
    warnings.warn(f"warned on rank {ctx.rank}", UserWarning, stacklevel=1)
    record_pids(ctx)
    assert ctx.rank == 0

def test_output_sections():
    run_on_ranks(chatty, world_size=2)

@pytest.mark.world_size(2, 3)
def test_parametrized(world_size):
    assert len(run_on_ranks(record_pids, world_size=world_size)) == world_size

@pytest.mark.world_size(4)
def test_too_big():
    pass

def test_max_world_size():
    assert max_world_size() == 2

def test_default_profile_is_dev():
    from hypothesis import settings
    assert settings.get_current_profile_name() == "dev"
    assert settings.default.deadline is None
"""


def test_output_sections_markers_and_no_process_left(run, pytester) -> None:
    pytester.makeconftest("import pytest\npytest.register_assert_rewrite('helper_checks')\n")
    pytester.makepyfile(helper_checks="def check_config(c):\n    assert c == {'lr': 0.1}\n")
    result = run(OUTPUT_AND_MARKERS, "--nproc", "2", "-rs")
    result.assert_outcomes(failed=2, passed=3, skipped=2)
    result.stdout.fnmatch_lines_random(
        [
            "*Captured rank 0 stdout call*",
            "hello from rank 0",
            "*Captured rank 1 stderr call*",
            "complaint from rank 1",
            "*= rank warnings summary =*",
            "*UserWarning: warned on rank 0",  # rank 1's is folded into rank 0's
            "  2x, on rank(s) 0, 1, in 1 job(s); 1 more like it",
            "SKIPPED * test_subject.py:*: needs world size 3 but --nproc is 2*",
            "SKIPPED * test_subject.py:*: needs world size 4 but --nproc is 2; run with --nproc 4*",
            "*shardcheck: nproc=2 backend=auto*",
        ]
    )
    pids = rank_pids(pytester)
    assert len(pids) == 4
    assert not any(alive(pid) for pid in pids)


def test_exit_on_first_failure_leaves_no_process(run, pytester) -> None:
    result = run(
        CRASH.replace(
            "def test_crash",
            "def test_0_ok():\n    run_on_ranks(record_pids, world_size=2)\n\ndef test_crash",
        ),
        "-x",
    )
    result.assert_outcomes(failed=1, passed=1)
    pids = rank_pids(pytester)
    assert len(pids) == 2
    assert not any(alive(pid) for pid in pids)


SLEEPER = """
def sleep_forever(ctx):
    record_pids(ctx)
    time.sleep(120)

def test_sleeps():
    run_on_ranks(sleep_forever, world_size=2)
"""


def test_ctrl_c_stops_the_pool(pytester, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PIDS_FILE", str(pytester.path / "pids.txt"))
    pytester.makepyfile(test_subject=HEADER + SLEEPER)
    cmd = [sys.executable, "-m", "pytest", *PLUGIN, "-p", "no:cacheprovider", "test_subject.py"]
    # A job started in the background of a non-interactive shell (nohup ... &) inherits
    # SIGINT as ignored, and Python then installs no Ctrl-C handler: the child gets the
    # default back, as in a terminal.
    proc = subprocess.Popen(
        cmd,
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 180
        while len(rank_pids(pytester)) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.2)
        pids = rank_pids(pytester)
        assert len(pids) == 2
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "KeyboardInterrupt" in output
    assert not any(alive(pid) for pid in pids)


def test_bad_strategy_is_a_usage_error(run) -> None:
    result = run("def test_nothing():\n    pass\n", "--strategy", "no_such_module_xyz:f")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--strategy='no_such_module_xyz:f': module 'no_such_module_xyz' could not be imported*"]
    )


def test_hypothesis_profiles_are_registered() -> None:
    from hypothesis import settings

    ci = settings.get_profile("ci")
    assert (ci.max_examples, ci.derandomize, ci.deadline, ci.database, ci.print_blob) == (
        6,
        True,
        None,
        None,
        True,
    )
    dev = settings.get_profile("dev")
    assert (dev.max_examples, dev.deadline, dev.print_blob) == (25, None, True)
    nightly = settings.get_profile("nightly")
    assert (nightly.max_examples, nightly.derandomize, nightly.deadline) == (250, False, None)
    assert nightly.database is not None


TIMEOUTS = """
from hypothesis import given, strategies as st

@given(st.integers())
def test_drawn(request, x):
    print("drawn timeout", request.node.get_closest_marker("timeout").args)

@pytest.mark.timeout(5)
@given(st.integers())
def test_own(request, x):
    print("own timeout", request.node.get_closest_marker("timeout").args)

def test_plain(request):
    print("plain timeout", request.node.get_closest_marker("timeout"))
"""


@pytest.mark.parametrize("profile,expected", [("ci", 300.0), ("dev", 1250.0), ("nightly", 12500.0)])
def test_a_hypothesis_test_gets_a_timeout_scaled_to_the_profile(
    run: Any, pytester: pytest.Pytester, profile: str, expected: float
) -> None:
    pytester.makeini("[pytest]\ntimeout = 300\n")
    result = run(TIMEOUTS, f"--hypothesis-profile={profile}", "-s")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([f"*drawn timeout ({expected},)*"])
    result.stdout.fnmatch_lines(["*own timeout (5,)*"])  # a test's own timeout wins
    result.stdout.fnmatch_lines(["*plain timeout None*"])  # plain tests keep the ini value


CONFORMANCE = (
    []
    if any(ep.value == "harness.conformance" for ep in entry_points(group="pytest11"))
    else ["-p", "harness.conformance"]
)

#: a conftest that records the session's warm_up (which starts the forkserver, so the ranks)
#: instead of running it, and registers a profile of its own
WARM_UP_SPY = """
import os
from hypothesis import settings
from harness.run.session import HarnessSession

settings.register_profile("mine", max_examples=3)

def record_warm_up(self):
    with open(os.environ["WARM_UP_FILE"], "a") as f:
        f.write("warm_up\\n")

HarnessSession.warm_up = record_warm_up
"""

REFUSED = [
    (
        ["--hypothesis-profile=nope"],
        "ERROR: --hypothesis-profile='nope' is not a registered Hypothesis profile; pass one "
        "of: ci, default, dev, mine, nightly.",
    ),
    (
        ["--clauses", "NOPE-9,CLIP-1"],
        "ERROR: --clauses: no clause matches 'NOPE-9'; see `pytest --list-clauses` for every "
        "id (such as API-1, CKPT-RT-3; globs such as CKPT-* work too).",
    ),
    (
        ["--conformance-report", "{tmp}/file/report"],
        "ERROR: --conformance-report='{tmp}/file/report': cannot create the directory: "
        "[Errno 20] Not a directory; pass a directory you can write to, e.g. "
        "--conformance-report ./conformance-report.",
    ),
]


@pytest.fixture
def spied(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Install :data:`WARM_UP_SPY`; the file it writes a line to at each warm_up."""
    pytester.makeconftest(WARM_UP_SPY)
    record = pytester.path / "warm_up.txt"
    monkeypatch.setenv("WARM_UP_FILE", str(record))
    return record


@pytest.mark.parametrize(("args", "expected"), REFUSED, ids=["profile", "clauses", "report"])
def test_bad_input_is_refused_in_one_line_before_any_rank_starts(
    run: Any, pytester: pytest.Pytester, spied: Path, args: list[str], expected: str
) -> None:
    (pytester.path / "file").write_text("not a directory")
    args = [a.format(tmp=pytester.path) for a in args]
    never = "def test_never():\n    raise AssertionError('this test ran')\n"
    start = time.monotonic()
    result = run(never, *CONFORMANCE, *args)
    took = time.monotonic() - start
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert [line for line in result.stderr.lines if line.strip()] == [
        expected.format(tmp=pytester.path)
    ]
    assert not spied.exists(), f"warm_up ran: the ranks were started ({took:.1f} s)"
    assert "collected" not in result.stdout.str() and "this test ran" not in result.stdout.str()


def test_good_inputs_pass_the_start_up_checks(
    run: Any, pytester: pytest.Pytester, spied: Path
) -> None:
    out = pytester.path / "new" / "report"
    source = (
        "@pytest.mark.clause('CLIP-1')\ndef test_clip():\n    from hypothesis import settings\n"
        "    assert settings.get_current_profile_name() == 'mine'\n"
    )
    args = ["--hypothesis-profile=mine", "--clauses", "clip-*", "--conformance-report", str(out)]
    result = run(source, *CONFORMANCE, *args)
    result.assert_outcomes(passed=1)
    written = ["report.html", "report.json", "report.md", "summary.md"]
    assert sorted(p.name for p in out.iterdir()) == written
    assert spied.read_text() == "warm_up\n"  # the spy does see the start when there is one
