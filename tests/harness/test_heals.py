"""Heals are visible: every restart of the ranks is kept with its cause and its check, and
the terminal and the report count them (see [Note: heals are counted] in harness.pool.rankpool)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

import harness.run.session
from harness import RankFailure, run_on_ranks
from harness.pool.heals import Heal, describe_heals
from tests.harness.test_harness_faults import segfault_on_rank_one

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_crash_is_kept_as_a_heal_with_its_check(request: pytest.FixtureRequest) -> None:
    session = harness.run.session.current()
    before = len(session.heals)
    with pytest.raises(RankFailure):
        run_on_ranks(segfault_on_rank_one, world_size=2, timeout=4.0)
    assert session.heals[before:] == [Heal(2, "crash", request.node.nodeid)]


def test_heals_are_described_per_world_size_and_cause() -> None:
    heals = [
        Heal(2, "crash", "t.py::a"),
        Heal(2, "crash", "t.py::b"),
        Heal(4, "hang", "t.py::c"),
        Heal(2, "start failure", "t.py::a"),
    ]
    assert describe_heals(heals) == [
        "the ranks were restarted 4 times:",
        "  world size 2: 2 crash (t.py::a, t.py::b); 1 start failure (t.py::a)",
        "  world size 4: 1 hang (t.py::c)",
    ]
    assert describe_heals([]) == []


def test_a_run_with_a_forced_heal_counts_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_crashing=textwrap.dedent(
            """
            import os, signal
            import pytest
            from harness import run_on_ranks

            def crash(ctx):
                if ctx.rank == 1:
                    os.kill(os.getpid(), signal.SIGSEGV)

            def ok(ctx):
                return ctx.rank

            @pytest.mark.clause("API-1")
            def test_crash():
                run_on_ranks(crash, world_size=2, timeout=4.0)

            @pytest.mark.clause("API-1")
            def test_after():
                assert run_on_ranks(ok, world_size=2) == [0, 1]
            """
        )
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "--nproc", "2", "--conformance-report", "out", timeout=180
        )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "shardcheck: the ranks were restarted 1 time:",
            "  world size 2: 1 crash (test_crashing.py::test_crash)",
        ]
    )
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    assert report["run"]["heals"] == [
        {"world_size": 2, "cause": "crash", "check": "test_crashing.py::test_crash"}
    ]
    assert "1 restart of the ranks" in (pytester.path / "out" / "summary.md").read_text()
