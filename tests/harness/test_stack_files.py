"""A local rank's stack file is read one whole dump at a time (see [Note: a dump is read
whole] in harness.pool.transports.pipes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.pool.transports.pipes import RankFiles
from harness.rank.worker import END_OF_DUMP

MAIN = 'Thread 0x1 (most recent call first):\n  File "/t/job.py", line 3 in sleep_for\n'
ROOT = Path(__file__).resolve().parents[2]
OTHER = 'Thread 0x2 (most recent call first):\n  File "/h/worker.py", line 9 in watch\n'


def _append(files: RankFiles, text: str) -> None:
    with open(files.path(0, "stacks"), "a") as f:
        f.write(text)


def test_a_dump_cut_between_two_threads_is_not_read_until_it_is_whole(tmp_path: Path) -> None:
    files = RankFiles(str(tmp_path), 1)
    _append(files, MAIN)  # the rank lost its core after its first thread
    assert files.collect_stacks([0], settle=0.2) == {}
    _append(files, OTHER + END_OF_DUMP)
    assert files.collect_stacks([0], settle=0.2) == {0: MAIN + OTHER}
    # the next sample of the same, unmoved rank reads the same text: nothing moved
    _append(files, MAIN + OTHER + END_OF_DUMP)
    assert files.collect_stacks([0], settle=0.2) == {0: MAIN + OTHER}


def test_only_the_last_whole_dump_counts_and_a_crash_dump_comes_without_markers(
    tmp_path: Path,
) -> None:
    files = RankFiles(str(tmp_path), 1)
    _append(files, "old\n" + END_OF_DUMP + MAIN + END_OF_DUMP + "Fatal Python error: Segm")
    assert files.collect_stacks([0], settle=0.2) == {0: MAIN}
    _append(files, "entation fault\n\n" + OTHER)
    assert files.new_stacks(0) == "Fatal Python error: Segmentation fault\n\n" + OTHER


_RANK_SIDE = """
import os, signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # before any thread, as a rank does
from harness.rank import worker
assert worker.STACK_SIGNAL == signal.SIGUSR1
stacks = open(sys.argv[1], "a")
worker._dump_stacks_on_signal(stacks)
def waiting_in_a_job():
    os.kill(os.getpid(), worker.STACK_SIGNAL)
    end = time.monotonic() + 20.0
    while worker.END_OF_DUMP not in open(sys.argv[1]).read() and time.monotonic() < end:
        time.sleep(0.02)
waiting_in_a_job()
"""


def test_a_rank_marks_the_end_of_each_dump_it_is_asked_for(tmp_path: Path) -> None:
    """The rank side (in a process of its own, as a rank): the thread that takes the signal
    writes the dump of every thread, then the marker."""
    path = tmp_path / "stacks"
    subprocess.run([sys.executable, "-c", _RANK_SIDE, str(path)], check=True, timeout=60, cwd=ROOT)
    text = path.read_text()
    assert text.endswith(END_OF_DUMP)
    assert "waiting_in_a_job" in text
