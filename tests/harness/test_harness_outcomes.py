"""The wording of outcomes and of RankFailure (single process, fast)."""

from __future__ import annotations

import pickle

from harness import Outcome, RankFailure
from harness.verdicts.outcomes import (
    RemoteError,
    fatal_dump,
    format_story,
    normalize_per_rank,
    outcome_from_reply,
    rank_range,
    tidy_stacks,
)
from harness.wire.protocol import Reply


def _outcomes() -> list[Outcome]:
    return [
        Outcome(
            0, "raised", error=RemoteError("ValueError", "bad\nmore", "Traceback: tb0"), elapsed=0.5
        ),
        Outcome(1, "crashed", exitcode=-11, elapsed=0.1, stderr="line1\nboom\n"),
        Outcome(2, "ok", value=3, elapsed=0.05),
        Outcome(
            3,
            "hung",
            detail="still running at the deadline (4.0 s)",
            elapsed=4.0,
            stacks='  File "x.py", line 3 in spin\n',
        ),
        Outcome(4, "crashed", exitcode=3, elapsed=0.2),
    ]


def test_story_is_ordered_first_failure_first_with_ok_ranks_last() -> None:
    story = format_story(_outcomes(), "job 7: m:f at world size 5")
    lines = story.splitlines()
    assert lines[0] == (
        "job 7: m:f at world size 5: rank 1 crashed, rank 4 crashed, "
        "rank 0 raised, rank 3 hung; 1 of 5 ranks ok (first failure first)"
    )
    heads = [line for line in lines if line.startswith("rank ")]
    assert heads == [
        "rank 1 crashed: killed by SIGSEGV (exit code -11) after 0.10 s",
        "rank 4 crashed: process exited with code 3 after 0.20 s",
        "rank 0 raised ValueError: bad after 0.50 s",
        "rank 3 hung: still running at the deadline (4.0 s)",
        "rank 2 ok after 0.05 s",
    ]
    assert "    Traceback: tb0" in lines
    assert "    Python stacks:" in lines
    assert lines[lines.index("    stderr (last lines):") + 2] == "    boom"  # stderr tail


def test_rank_failure_exposes_outcomes_and_pickles() -> None:
    outcomes = _outcomes()
    failure = RankFailure(format_story(outcomes, "job"), outcomes)
    assert failure.failed_ranks == [1, 4, 0, 3]
    copy = pickle.loads(pickle.dumps(failure))
    assert str(copy) == str(failure)
    assert [o.kind for o in copy.outcomes] == [o.kind for o in outcomes]


def test_tidy_stacks_drops_the_watchdog_and_harness_frames() -> None:
    dump = (
        "Thread 0x1 (most recent call first):\n"
        '  File "/r/harness/rank/worker.py", line 9 in watch\n'
        '  File "/lib/threading.py", line 9 in run\n'
        "\n"
        "Thread 0x3 (most recent call first):\n"
        '  File "/r/harness/rank/worker.py", line 150 in dump_stacks\n'
        '  File "/lib/threading.py", line 9 in run\n'
        "\n"
        "Current thread 0x2 (most recent call first):\n"
        '  File "/t/test_x.py", line 5 in spin\n'
        '  File "/r/harness/rank/runner.py", line 280 in _call\n'
        '  File "/r/harness/rank/runner.py", line 40 in run_job\n'
        '  File "/r/harness/rank/worker.py", line 190 in serve\n'
        "\n"
        "Extension modules: numpy (total: 1)\n"
    )
    assert tidy_stacks(dump) == (
        'Current thread 0x2 (most recent call first):\n  File "/t/test_x.py", line 5 in spin\n'
    )
    assert tidy_stacks("") == ""


def _raised(rank: int, message: str, traceback: str, elapsed: float) -> Outcome:
    return Outcome(
        rank, "raised", error=RemoteError("ValueError", message, traceback), elapsed=elapsed
    )


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/s/strategy.py", line 12, in step\n'
    "    raise ValueError(f'rank {{rank}}: bad grad at {{hex(id(p))}}')\n"
    "ValueError: rank {rank}: bad grad at 0x7f{rank}a0 (pid {pid}, tmp dir /tmp/tmp{rank}ab_cdef)\n"
)


def test_ranks_with_the_same_traceback_show_it_once() -> None:
    outcomes = [
        _raised(r, f"rank {r}: bad grad", TRACEBACK.format(rank=r, pid=4100 + r), 0.1 * (r + 1))
        for r in range(4)
    ]
    outcomes[2] = _raised(
        2, "other", TRACEBACK.replace("line 12", "line 40").format(rank=2, pid=1), 0.3
    )
    story = format_story(outcomes, "job 3")
    lines = story.splitlines()
    assert lines[1:5] == [
        "rank 0 raised ValueError: rank 0: bad grad after 0.10 s",
        "rank 1 raised ValueError: rank 1: bad grad after 0.20 s",
        "rank 3 raised ValueError: rank 3: bad grad after 0.40 s",
        "ranks 0, 1, 3: same traceback (rank 0's)",
    ]
    assert story.count("line 12, in step") == 1 and "pid 4100" in story  # rank 0's, as it was
    assert lines.index("rank 2 raised ValueError: other after 0.30 s") > 4
    assert story.count("line 40, in step") == 1  # another line: another traceback


def test_rank_ranges_are_short() -> None:
    assert rank_range([3, 0, 1, 2]) == "ranks 0-3"
    assert rank_range([0, 2, 5, 6, 7]) == "ranks 0, 2, 5-7"
    assert rank_range([4]) == "rank 4"
    assert normalize_per_rank("rank 3 pid=77 at 0xdeadbeef on 10.0.0.5:29500") == (
        "rank <N> pid=<PID> at <ADDR> on <HOST>"
    )


def test_a_crash_shows_its_fatal_dump_not_the_stall_samples_before_it() -> None:
    sample = (
        "Current thread 0x2 (most recent call first):\n"
        '  File "/t/strategy.py", line 7 in make_strategy\n\n'
    )
    fatal = (
        "Fatal Python error: Segmentation fault\n\n"
        "Current thread 0x2 (most recent call first):\n"
        '  File "/t/strategy.py", line 31 in gather\n'
    )
    assert fatal_dump(sample + fatal) == fatal
    assert fatal_dump(sample) == sample  # SIGKILL: no fatal error, the last sample stays
    reply = Reply(1, None, exitcode=-11, stacks=sample + fatal)
    crashed = outcome_from_reply(reply, (), elapsed=3.8)
    assert crashed is not None and crashed.kind == "crashed"
    story = crashed.story()
    assert "fatal error dump:" in story and "line 31 in gather" in story
    assert "make_strategy" not in story


def test_a_crash_without_python_frames_says_so() -> None:
    reply = Reply(2, None, exitcode=-11, stacks="Fatal Python error: Segmentation fault\n\n")
    crashed = outcome_from_reply(reply, (), elapsed=1.0)
    assert crashed is not None
    assert "no Python frame in it: the crashing thread ran no Python code" in crashed.story()
