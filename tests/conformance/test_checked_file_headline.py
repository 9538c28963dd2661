"""A load that fails on a checkpoint found right as written says so first ([Note: a load after
a right file] in harness/verdicts/checked_file.py); the signature does not change."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.conformance.findings.signatures import attribute
from harness.verdicts.checked_file import checked_file_of, loading_checked_file
from harness.verdicts.outcomes import Outcome, RankFailure, RemoteError

ROOT = Path(__file__).resolve().parents[2]
JOBS = f"{ROOT}/suites/lib/ranks/checkpoint_jobs.py"
TEAM = "/src/team/team.py"
FOUND = "the full checkpoint as written matches the plain model and optimizer"


def _failure(type_name: str, message: str, *frames: tuple[str, int, str]) -> RankFailure:
    lines = ["Traceback (most recent call last):", f'  File "{JOBS}", line 500, in load_rank']
    lines += [f'  File "{file}", line {line}, in {func}' for file, line, func in frames]
    error = RemoteError(type_name, message, "\n".join(lines) + "\n")
    outcomes = [Outcome(0, "raised", error=error), Outcome(1, "raised", error=error)]
    return RankFailure("job 2: rank 0 raised, rank 1 raised", outcomes)


def _escaping(found: str, failure: BaseException) -> BaseException:
    with pytest.raises(type(failure)) as info, loading_checked_file(found):
        raise failure
    return info.value


IN_LOAD = ((TEAM, 410, "load_checkpoint"), (TEAM, 575, "_load_optimizers"))


def test_a_load_that_raises_on_a_right_file_says_the_file_matches_first() -> None:
    plain = attribute(_failure("KeyError", "'param_groups'", *IN_LOAD))
    told = attribute(_escaping(FOUND, _failure("KeyError", "'param_groups'", *IN_LOAD)))
    assert told.message == (
        f"{FOUND}; the load raised KeyError 'param_groups' at /src/team/team.py:575 "
        "_load_optimizers"
    )
    assert told.signature(["CKPT-RT-1"]) == plain.signature(["CKPT-RT-1"])
    assert plain.message.startswith("in load_rank, loading a checkpoint (load_checkpoint)")


def test_a_long_message_and_an_empty_one_are_told_after_the_file_too() -> None:
    text = "Error(s) in loading state_dict for Model: size mismatch for fc.weight"
    long = attribute(_escaping(FOUND, _failure("RuntimeError", text, *IN_LOAD)))
    assert long.message == f"{FOUND}; the load raised RuntimeError: {text} at {TEAM}:575 " + (
        "_load_optimizers"
    )
    empty = attribute(_escaping(FOUND, _failure("AssertionError", "", *IN_LOAD)))
    assert empty.message == (
        f"{FOUND}; the load raised AssertionError with an empty message, raised in "
        f"{TEAM}:575 _load_optimizers"
    )


def test_a_failure_outside_the_load_keeps_its_own_headline() -> None:
    step = ((TEAM, 170, "optimizer_step"), (TEAM, 181, "_step"))
    text = "aten.lerp_.Scalar got mixed torch.Tensor and DTensor, for distributed operator"
    told = attribute(_escaping(FOUND, _failure("RuntimeError", text, *step)))
    assert told.message == text


def test_nothing_found_right_leaves_the_failure_as_it_is_and_the_inner_words_win() -> None:
    failure = _failure("KeyError", "'state'", *IN_LOAD)
    assert checked_file_of(_escaping("", failure)) == ""
    inner = _failure("KeyError", "'state'", *IN_LOAD)
    with pytest.raises(RankFailure) as info, loading_checked_file("outer words"):
        with loading_checked_file(FOUND):
            raise inner
    assert checked_file_of(info.value) == FOUND


def test_loading_checked_file_takes_words_only() -> None:
    with pytest.raises(TypeError, match="words that say what was found right"):
        with loading_checked_file(True):  # type: ignore[arg-type]
            pass
