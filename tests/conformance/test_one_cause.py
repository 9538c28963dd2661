"""One cause, one finding ([Note: one cause, one finding] in
harness/conformance/findings/one_cause.py):
the same raise at the same strategy line is one finding whichever clause each check filed it
under, the same raise under two precisions is one, a step in a round trip's save half is not
the round trip's, and the same wrong entry whichever optimizer's state it holds is one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.conformance.findings.masking import difference
from harness.conformance.findings.one_cause import joined_clauses, same_raise
from harness.conformance.findings.signatures import attribute
from harness.conformance.outcomes.checks import Check
from harness.conformance.outcomes.triage import Triage
from harness.verdicts.outcomes import Outcome, RankFailure, RemoteError

ROOT = Path(__file__).resolve().parents[2]
JOBS = f"{ROOT}/suites/lib/ranks/checkpoint_jobs.py"
TRAINING = f"{ROOT}/suites/lib/ranks/training.py"
TORCH = "/venv/lib/python3.11/site-packages/torch"
MINE = "/src/team/my_strategy.py"

#: a bf16 unit's backward: what torch raises, at the strategy's line that called it
BACKWARD = (MINE, 166, "backward")
ASSIGN = (f"{TORCH}/autograd/graph.py", 825, "_engine_run_backward")


def _traceback(*frames: tuple[str, int, str]) -> str:
    lines = ["Traceback (most recent call last):"]
    lines += [f'  File "{file}", line {line}, in {func}' for file, line, func in frames]
    return "\n".join(lines) + "\n"


def _failure(message: str, text: str, clause: str = "", type_name: str = "RuntimeError") -> Any:
    error = RemoteError(type_name, message, text, clause=clause)
    outcomes = [Outcome(0, "raised", error=error), Outcome(1, "raised", error=error)]
    return RankFailure("job 1: rank 0 raised, rank 1 raised", outcomes)


def _check(check_id: str, *clauses: str) -> Check:
    return Check(id=check_id, nodeid=check_id, clauses=list(clauses))


def _step_in(job: str, *inner: tuple[str, int, str]) -> str:
    """A training step's traceback in suite job ``job`` (checkpoint_jobs.py), through
    ``train`` and ``micro_step``, then the strategy's backward and torch."""
    return _traceback(
        (JOBS, 281, job),
        *inner,
        (TRAINING, 160, "train"),
        (TRAINING, 114, "micro_step"),
        BACKWARD,
        ASSIGN,
    )


def _grad_dtype(dtype: str) -> str:
    return f"attempting to assign a gradient with dtype {dtype} to a tensor of dtype Float"


def test_the_same_raise_under_bf16_mixed_and_16_mixed_is_one_finding() -> None:
    triage = Triage({})
    text = _traceback((JOBS, 281, "frozen_start_rank"), BACKWARD, ASSIGN)
    bf16, fp16 = (
        _check("test_frozen[bf16-mixed]", "PREC-2"),
        _check("test_frozen[16-mixed]", "PREC-2"),
    )
    first = triage.attribute(bf16, _failure(_grad_dtype("BFloat16"), text, "PREC-2"))
    second = triage.attribute(fp16, _failure(_grad_dtype("Half"), text, "PREC-2"))
    assert second is first and first.clauses == ["PREC-2"]
    assert first.checks == [bf16.id, fp16.id]
    assert fp16.failed_clauses == ["PREC-2"] and fp16.blocked_by == ""
    assert "BFloat16" in first.attribution.message  # the headline keeps what was raised


def test_the_same_raise_tagged_with_other_clauses_is_one_finding_blocking_the_rest() -> None:
    triage = Triage({})
    text = _traceback((JOBS, 281, "train_rank"), (TRAINING, 114, "micro_step"), BACKWARD, ASSIGN)
    precision = _check("test_precision[bf16-mixed]", "PREC-2")
    first = triage.attribute(precision, _failure(_grad_dtype("BFloat16"), text, "PREC-2"))
    sync = _check("test_no_sync[bf16-mixed]", "SYNC-1", "MP-4")
    again = triage.attribute(sync, _failure(_grad_dtype("BFloat16"), text, "SYNC-1"))
    assert again is first and first.clauses == ["PREC-2"]
    assert sync.blocked_by == "PREC-2" and sync.failed_clauses == ["PREC-2"]
    assert len(triage.findings) == 1


def test_another_line_or_another_exception_is_another_finding() -> None:
    triage = Triage({})
    text = _traceback((JOBS, 281, "train_rank"), BACKWARD, ASSIGN)
    elsewhere = _traceback((JOBS, 281, "train_rank"), (MINE, 201, "backward"), ASSIGN)
    one = triage.attribute(_check("a", "PREC-2"), _failure(_grad_dtype("Half"), text, "PREC-2"))
    other_line = _failure(_grad_dtype("Half"), elsewhere, "SYNC-1")
    assert triage.attribute(_check("b", "SYNC-1"), other_line) is not one
    other_type = _failure(_grad_dtype("Half"), text, "SYNC-1", type_name="ValueError")
    assert triage.attribute(_check("c", "SYNC-1"), other_type) is not one
    assert len(triage.findings) == 3


def test_a_suites_assertion_or_a_crash_is_never_the_same_raise() -> None:
    assertion = attribute(AssertionError("PREC-2: rank 0: sharded parameters are float32"))
    assert assertion.kind == "assertion" and same_raise(assertion) == ""
    crash = RankFailure("job 1: rank 0 crashed", [Outcome(0, "crashed", exitcode=-11)])
    assert same_raise(attribute(crash)) == ""


def test_a_step_in_the_round_trips_save_half_is_not_filed_under_the_round_trip() -> None:
    triage = Triage({})
    before_save = _step_in("round_trip_save_rank", (JOBS, 460, "_round_trip_save"))
    check = _check("test_round_trip[model_parallel-full]", "CKPT-RT-1", "CKPT-LOAD-2")
    finding = triage.attribute(check, _failure(_grad_dtype("BFloat16"), before_save, "API-4"))
    assert finding.clauses == ["API-4"] and check.blocked_by == "API-4"
    assert attribute(_failure(_grad_dtype("BFloat16"), before_save, "API-4")).through == ()
    # the same step after the load (the load half) still looks through the round trip
    after_load = _step_in("round_trip_load_rank")
    assert attribute(_failure("x", after_load, "API-4")).through[:1] == ("CKPT-RT-1",)


def test_a_step_before_the_save_and_in_a_precision_check_is_one_finding_of_the_step() -> None:
    triage = Triage({})
    before_save = _step_in("round_trip_save_rank", (JOBS, 460, "_round_trip_save"))
    round_trip = _check("test_round_trip[model_parallel-full]", "CKPT-RT-1")
    first = triage.attribute(round_trip, _failure(_grad_dtype("BFloat16"), before_save, "API-4"))
    in_training = _step_in("train_rank")
    precision = _check("test_precision[16-mixed]", "PREC-2")
    again = triage.attribute(precision, _failure(_grad_dtype("Half"), in_training, "API-4"))
    assert again is first and first.clauses == ["API-4"]
    assert precision.blocked_by == "API-4" and round_trip.blocked_by == "API-4"


def test_joined_clauses_fail_a_check_that_declares_them_and_block_one_that_does_not() -> None:
    assert joined_clauses(["PREC-2"], ["PREC-2", "TRAIN-4"]) == (["PREC-2"], "")
    assert joined_clauses(["PREC-2"], ["CKPT-RT-1"]) == (["PREC-2"], "PREC-2")


def test_one_wrong_entry_is_one_difference_whichever_optimizers_state_it_holds() -> None:
    def written(state: str) -> str:
        return (
            "CKPT-RT-2: saved at world size 2 (model_parallel, sharded): the sharded checkpoint "
            f"as written holds optimizer['state']['blocks.0.fc1.bias']: state {state} where the "
            "plain optimizer holds none (a parameter that never stepped, or a frozen one)"
        )

    adam = difference(written("['exp_avg', 'exp_avg_sq', 'step']"))
    sgd = difference(written("['momentum_buffer']"))
    assert adam == sgd and "state [NAMES] where the plain optimizer holds none" in adam


def test_one_wrong_file_is_one_difference_whichever_model_entry_a_check_read_first() -> None:
    def written(entry: str, shapes: str) -> str:
        return (
            "CKPT-RT-2: saved at world size 4 (model_parallel, sharded): the sharded checkpoint "
            f"as written holds model[{entry!r}]: shape {shapes} where the plain model holds "
            "shape (8,)"
        )

    first = difference(written("blocks.0.fc1.bias", "(2,)"))
    assert first == difference(written("blocks.0.attn.mha.in_proj_bias", "(6,)"))
    assert first == "model[…]: shape (N,) where the plain model holds shape (N,)"
    # a nested value after a load keeps its entry: which state a load lost is what differs
    loaded = "CKPT-RT-2: loaded at world size 2 (fsdp): model['fc.weight']: 3 of 4 elements differ"
    assert difference(loaded).startswith("model['fc.weight']: ")
