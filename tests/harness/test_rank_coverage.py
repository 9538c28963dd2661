"""``--rank-coverage``: every rank's data is measured, saved per job and combined."""

from __future__ import annotations

import json
import os
import re
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import harness
from harness.rank import coverage as rank
from harness.rank.coverage_config import ENV_VAR, RankCoverageConfig, require_coverage

REPO = str(Path(harness.__file__).resolve().parent.parent)
PLUGINS = {ep.value for ep in entry_points(group="pytest11")}
EXTRA = [] if "harness.plugin" in PLUGINS else ["-p", "harness.plugin"]
EXTRA += [] if "harness.rankcoverage.plugin" in PLUGINS else ["-p", "harness.rankcoverage.plugin"]

MEASURED = '''
"""Measured by the test: some lines run on rank 1 only, one function never runs."""

FACTOR = 3  # module level: run in the controller (and the forkserver), never on a rank


def before_crash(x):
    if x > 0:
        return x * FACTOR  # first rank 1 process only
    return -x


def after_respawn():
    return "respawned"  # respawned rank 1 only


def never_called():
    return 42  # nobody
'''

SUBJECT = """
import os, signal
from harness import run_on_ranks
import measured

def first(ctx):
    return measured.before_crash(2) if ctx.rank == 1 else 0

def crash(ctx):
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return ctx.rank

def second(ctx):
    return measured.after_respawn() if ctx.rank == 1 else 0

def test_first():
    assert run_on_ranks(first, world_size=2) == [0, 6]

def test_crash():
    run_on_ranks(crash, world_size=2)

def test_second():
    assert run_on_ranks(second, world_size=2) == [0, "respawned"]
"""


def _line_of(text: str, source: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def test_rank_data_is_saved_per_job_and_combined(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("SHARDCHECK_STRATEGY", raising=False)
    monkeypatch.delenv(ENV_VAR, raising=False)
    pytester.makepyfile(measured=MEASURED, test_subject=SUBJECT)
    result = pytester.runpytest_subprocess(
        *EXTRA, "-p", "no:cacheprovider", "--nproc", "2", "--rank-timeout", "30",
        "--rank-coverage=measured", "--rank-coverage-dir", "cov", timeout=240,
    )  # fmt: skip
    result.assert_outcomes(passed=2, failed=1)
    line = re.compile(
        r"rank coverage of measured: (\S+)% lines, (\S+)% branches, (\d+) processes combined "
        r"\((\d+) ranks, 1 controller\); report: cov"
    )
    found = [m for m in map(line.search, result.outlines) if m]
    assert found, result.outlines
    lines_pct, branches_pct, processes, ranks = found[-1].groups()
    assert int(ranks) >= 3  # two first ranks and at least the respawned rank 1
    assert int(processes) == int(ranks) + 1
    report = json.loads((pytester.path / "cov" / "coverage.json").read_text())
    (name,) = [n for n in report["files"] if n.endswith("measured.py")]
    source = (pytester.path / "measured.py").read_text()
    executed = set(report["files"][name]["executed_lines"])
    missing = set(report["files"][name]["missing_lines"])
    assert _line_of("FACTOR = 3", source) in executed  # controller: module level
    assert _line_of("first rank 1 process only", source) in executed  # saved before SIGKILL
    assert _line_of("respawned rank 1 only", source) in executed  # the respawned process
    assert _line_of("return -x", source) in missing
    assert _line_of("nobody", source) in missing
    assert float(lines_pct) == pytest.approx(report["totals"]["percent_statements_covered"], 0.1)
    assert float(branches_pct) == 50.0  # `if x > 0` only ever true
    assert not list((pytester.path / "cov").glob(".coverage.*"))  # per-process files merged
    assert "measured.py" in (pytester.path / "cov" / "coverage.txt").read_text()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--rank-coverage="], "give one or more package or module names"),
        (["--rank-coverage=suites/"], "'suites/' is not an importable dotted name"),
        (["--rank-coverage=a,,b"], "give one or more package or module names"),
        (["--rank-coverage-dir", "cov"], "has no effect without --rank-coverage"),
        (["--rank-coverage", "--rank-coverage-dir", "afile"], "is a file, not a directory"),
    ],
)
def test_bad_option_values_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], match: str
) -> None:
    pytester.makefile("", afile="not a directory")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert re.search(re.escape(match), result.stderr.str())


def test_missing_coverage_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "coverage", None)  # makes `import coverage` fail
    with pytest.raises(ModuleNotFoundError, match=r"needs the 'coverage' package.*pip install"):
        require_coverage()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "is not JSON"),
        ("[1]", "is not a JSON object"),
        ('{"data_dir": "relative"}', "data_dir='relative' must be an absolute directory"),
        ('{"data_dir": "/d", "sources": "pkg"}', "sources='pkg' must be a list"),
        ('{"data_dir": "/d", "branch": "yes"}', "branch='yes' must be true or false"),
    ],
)
def test_malformed_environment_is_refused(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=re.escape(match)):
        RankCoverageConfig.from_json(text)


def test_environment_round_trips() -> None:
    config = RankCoverageConfig("/tmp/x", ("reference_impl", "mypkg.sub"), branch=False)
    assert RankCoverageConfig.from_json(config.to_json()) == config


def test_disabled_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    before = rank._cov  # None unless this very session measures itself
    rank.start_from_env(0)
    rank.save()
    assert rank._cov is before
