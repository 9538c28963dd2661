"""A crashed rank's clause, read from its fatal-error dump and the suites' source."""

from __future__ import annotations

from pathlib import Path

import harness
from harness.conformance.findings.crash_site import clause_at_crash, dump_frames
from harness.conformance.outcomes.checks import Check
from harness.conformance.outcomes.triage import Triage
from harness.verdicts.outcomes import Outcome, RankFailure

ROOT = Path(harness.__file__).resolve().parents[1]
TRAINING = ROOT / "suites" / "lib" / "ranks" / "training.py"


def _line(path: Path, text: str) -> int:
    """The number of the one line of ``path`` that contains ``text``."""
    found = [n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(found) == 1, (text, found)
    return found[0]


def _dump(*frames: tuple[str, int, str], current: bool = False) -> str:
    lines = "".join(f'  File "{file}", line {line} in {func}\n' for file, line, func in frames)
    other = 'Thread 0x00007f0000000001 (most recent call first):\n  File "/x/t.py", line 1 in w\n\n'
    head = "Current thread 0x00007f0000000002" if current else "Thread 0x00007f0000000002"
    before = other if current else ""
    head += " (most recent call first):\n"
    return f"Fatal Python error: Segmentation fault\n\n{before}{head}{lines}"


TORCH = ("/venv/torch/distributed/_functional_collectives.py", 142, "wait_tensor")


def test_a_crash_inside_a_clause_block_of_the_suites_gets_that_clause() -> None:
    call = _line(TRAINING, "norm = t.strategy.clip_gradients_norm(")
    argument = _line(TRAINING, "max_norm=plan.clip,")  # a line of the same call, further in
    for line in (call, argument):
        dump = _dump(
            TORCH,
            ("/src/my_strategy.py", 40, "clip_gradients_norm"),
            (str(TRAINING), line, "train"),
        )
        assert clause_at_crash(dump) == "CLIP-1"
    step = _line(TRAINING, "t.strategy.backward(loss / plan.micro_batches, t.model)")
    outer = (str(TRAINING), _line(TRAINING, "losses.append(micro_step("), "train")
    # the innermost frame of the suites that is inside a block decides: micro_step's API-4,
    # not train's SYNC-1 around it
    assert clause_at_crash(_dump(TORCH, (str(TRAINING), step, "micro_step"), outer)) == "API-4"


def test_a_crash_outside_any_clause_block_gets_none() -> None:
    assert clause_at_crash(_dump(TORCH, ("/src/my_strategy.py", 40, "setup_module"))) == ""
    unrelated = (
        str(TRAINING),
        _line(TRAINING, "result.state = gathered_state(t.model)"),
        "train_rank",
    )
    assert clause_at_crash(_dump(TORCH, unrelated)) == ""
    assert clause_at_crash("") == ""


def test_the_dead_threads_frames_are_read_when_the_dump_marks_it() -> None:
    dump = _dump(TORCH, (str(TRAINING), 1, "train"), current=True)
    assert [f[2] for f in dump_frames(dump)] == ["wait_tensor", "train"]


def test_a_crash_in_a_clip_is_filed_under_clip_1_alone_not_the_whole_checks_clauses() -> None:
    line = _line(TRAINING, "norm = t.strategy.clip_gradients_norm(")
    dump = _dump(TORCH, (str(TRAINING), line, "train"))
    failure = RankFailure(
        "job 3: rank 1 crashed",
        [Outcome(0, "ok"), Outcome(1, "crashed", exitcode=-11, stacks=dump)],
    )
    check = Check(
        id="test_space[a]", nodeid="test_space[a]", clauses=["CKPT-RT-1", "CLIP-1", "TRAIN-1"]
    )
    finding = Triage({}).attribute(check, failure)
    assert finding.clauses == ["CLIP-1"]
    assert check.failed_clauses == ["CLIP-1"]
