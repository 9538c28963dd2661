"""Findings of strategies written outside this project: an exception raised inside a
strategy method is that method's clause's, a training step on what a broken load left is
blocked by the load's finding, headlines are never empty and lead with what is wrong, and
random parts of names do not split a finding."""

from __future__ import annotations

from pathlib import Path

from harness.conformance.findings.headlines import headline
from harness.conformance.findings.masking import mask
from harness.conformance.findings.signatures import attribute
from harness.conformance.outcomes.checks import Check
from harness.conformance.outcomes.triage import Triage
from harness.verdicts.attribution import method_clause
from harness.verdicts.outcomes import Outcome, RankFailure, RemoteError

ROOT = Path(__file__).resolve().parents[2]
SUITE = f"{ROOT}/suites/lib/ranks/checkpoint_jobs.py"
TORCH = "/venv/lib/python3.11/site-packages/torch"
MINE = "/src/team/my_strategy.py"

#: the clauses of a configuration-cover check (test_whole_configuration_space)
WHOLE_SPACE = ["CKPT-BUF-1", "CKPT-LOAD-2", "CKPT-RT-1", "CKPT-RT-5", "CLIP-1", "TRAIN-1"]


def _traceback(job: str, *frames: tuple[str, int, str]) -> str:
    lines = ["Traceback (most recent call last):"]
    suite = SUITE.replace("checkpoint_jobs", "resume_jobs") if job == "segment_rank" else SUITE
    lines.append(f'  File "{suite}", line 281, in {job}')
    lines += [f'  File "{file}", line {line}, in {func}' for file, line, func in frames]
    return "\n".join(lines) + "\n"


def _failure(type_name: str, message: str, text: str, clause: str = "") -> RankFailure:
    error = RemoteError(type_name, message, text, clause=clause)
    outcomes = [Outcome(0, "raised", error=error), Outcome(1, "raised", error=error)]
    return RankFailure("job 3: rank 0 raised, rank 1 raised", outcomes)


def _check(check_id: str, clauses: list[str]) -> Check:
    return Check(id=check_id, nodeid=check_id, clauses=list(clauses))


BARE_ASSERT = _traceback(
    "round_trip_rank",
    (MINE, 377, "load_checkpoint"),
    (MINE, 412, "_load_optimizers"),
    (f"{TORCH}/distributed/tensor/placement_types.py", 993, "_shard_tensor"),
)


def test_an_untagged_error_inside_load_checkpoint_is_the_round_trips_not_every_clause() -> None:
    triage = Triage({})
    check = _check("test_whole_space[a]", WHOLE_SPACE)
    finding = triage.attribute(check, _failure("AssertionError", "", BARE_ASSERT))
    assert finding.clauses == ["CKPT-RT-1"]
    assert check.failed_clauses == ["CKPT-RT-1"] and check.blocked_by == ""


def test_an_empty_message_names_the_type_and_the_strategys_own_frame() -> None:
    attribution = attribute(_failure("AssertionError", "", BARE_ASSERT))
    assert attribution.message == (
        "AssertionError with an empty message in /src/team/my_strategy.py:412 _load_optimizers "
        "(raised in torch/distributed/tensor/placement_types.py:993 _shard_tensor)"
    )
    assert attribution.method == "load_checkpoint"


def test_a_training_step_on_what_a_broken_load_left_is_blocked_by_the_loads_finding() -> None:
    triage = Triage({})
    load_bug = triage.attribute(
        _check("test_roundtrip[full]", ["CKPT-RT-1", "CKPT-LOAD-2"]),
        _failure("AssertionError", "", BARE_ASSERT),
    )
    step = _traceback(
        "segment_rank",  # suites/lib/ranks/resume_jobs.py's: the module says it resumes
        (MINE, 170, "optimizer_step"),
        (f"{TORCH}/optim/adam.py", 456, "_single_tensor_adam"),
    )
    resumed = _check("test_resume[full]", ["CKPT-RT-5"])
    shape_error = "The size of tensor a (4) must match the size of tensor b (1)"
    finding = triage.attribute(resumed, _failure("RuntimeError", shape_error, step, "API-4"))
    assert finding is load_bug and load_bug.clauses == ["CKPT-RT-1"]
    assert resumed.blocked_by == "CKPT-RT-1"


def test_a_training_step_that_fails_without_a_load_is_its_own_finding() -> None:
    triage = Triage({})
    step = _traceback(
        "train_rank",
        (MINE, 170, "optimizer_step"),
        (f"{TORCH}/optim/adam.py", 456, "_single_tensor_adam"),
    )
    check = _check("test_training[a]", ["TRAIN-1", "SYNC-1"])
    finding = triage.attribute(check, _failure("RuntimeError", "bad step", step))
    assert finding.clauses == ["TRAIN-1"] and check.blocked_by == ""


def test_the_method_decides_the_clause_among_those_the_check_declares() -> None:
    assert method_clause("load_checkpoint", ["MP-3", "CKPT-RT-3"]) == "CKPT-RT-3"
    assert method_clause("save_checkpoint", ["CKPT-SAVE-3", "MP-3"]) == "CKPT-SAVE-3"
    assert method_clause("optimizer_step", ["CKPT-RT-5"]) == "API-4"  # blocks the check
    assert method_clause("clip_gradients_norm", WHOLE_SPACE) == "CLIP-1"
    assert method_clause("_a_private_helper", WHOLE_SPACE) == ""


def test_headlines_lead_with_what_is_wrong() -> None:
    where = "rank 0, saved at world size 2 (model_parallel, sharded), loaded at world size 2"
    assert headline(f"CKPT-STRICT-1: {where}, strict=True, unexpected model keys: none") == (
        f"CKPT-STRICT-1: unexpected model keys: none ({where}, strict=True)"
    )
    assert headline("CKPT-STRICT-2: rank 1, strict=False: missing keys raised KeyError:") == (
        "CKPT-STRICT-2: missing keys raised KeyError: (empty message) (rank 1, strict=False)"
    )
    plain = "the total gradient norm of order 2.0 is nan"
    assert headline(plain) == plain


def test_random_parts_of_names_are_masked_in_finding_keys() -> None:
    first = mask("the directory held ['ckpt'] before, ['ckpt', 'ckpt.tmp-ff6bde41'] after")
    second = mask("the directory held ['ckpt'] before, ['ckpt', 'ckpt.tmp-78f62be4'] after")
    assert first == second and "ckpt.tmp-HEX" in first
    assert mask("left tmpab3k_x9q and 123e4567-e89b-12d3-a456-426614174000") == (
        "left TMPDIR and UUID"
    )
    assert mask("blocks.0.attn.wq.weight.decade") == "blocks.0.attn.wq.weight.decade"


def test_a_training_step_after_a_load_nobody_found_broken_is_the_round_trips() -> None:
    triage = Triage({})
    step = _traceback(
        "round_trip_rank",
        (MINE, 170, "optimizer_step"),
        (f"{TORCH}/optim/adam.py", 456, "_single_tensor_adam"),
    )
    mixed = "aten.lerp_.Scalar got mixed torch.Tensor and DTensor"
    first = _check("test_roundtrip[full]", ["CKPT-LOAD-2", "CKPT-RT-1", "MP-3"])
    finding = triage.attribute(first, _failure("RuntimeError", mixed, step, "API-4"))
    assert finding.clauses == ["CKPT-RT-1"] and first.blocked_by == ""
    sgd = _traceback(
        "round_trip_rank",
        (MINE, 170, "optimizer_step"),
        (f"{TORCH}/optim/sgd.py", 364, "_single_tensor_sgd"),
    )
    again = _check("test_whole_space[sgd]", WHOLE_SPACE)
    added = "aten.add_.Tensor got mixed torch.Tensor and DTensor"
    assert triage.attribute(again, _failure("RuntimeError", added, sgd, "API-4")) is finding
    assert again.blocked_by == "CKPT-RT-1"


def test_one_wrong_answer_seen_in_two_formats_is_one_finding() -> None:
    def refusal(fmt: str) -> BaseException:
        where = f"rank 0, saved at world size 2 (model_parallel, {fmt}), loaded at world size 2"
        try:
            raise AssertionError(f"CKPT-STRICT-2: {where}: optimizer with other groups: none")
        except AssertionError as exc:
            return exc.with_traceback(None)  # a suite's assertion: no strategy frame

    triage = Triage({})
    full = triage.attribute(_check("test_strict[full]", ["CKPT-STRICT-2"]), refusal("full"))
    sharded = _check("test_strict[sharded]", ["CKPT-STRICT-2"])
    assert triage.attribute(sharded, refusal("sharded")) is full
    assert full.attribution.message.startswith("CKPT-STRICT-2: optimizer with other groups: none")


def test_leftover_files_of_two_faults_with_random_names_are_one_key() -> None:
    from harness.conformance.findings.headlines import assertion_key

    def message(fault: str, suffix: str) -> str:
        listing = f"['ckpt'] before, ['ckpt', 'ckpt.tmp-{suffix}'] after"
        return f"CKPT-SAVE-6: model_parallel sharded save, {fault}: the directory held {listing}"

    keys = {
        assertion_key(message(f, s))
        for f, s in (("write error", "ff6bde41"), ("rank killed", "78f62be4"))
    }
    assert keys == {
        "CKPT-SAVE-N: the directory held ['ckpt'] before, ['ckpt', 'ckpt.tmp-HEX'] after"
    }
    assert headline(message("write error", "ff6bde41")).startswith(
        "CKPT-SAVE-6: the directory held ['ckpt'] before, ['ckpt', 'ckpt.tmp-ff6bde41'] after ("
    )


def test_a_collective_fingerprints_sequence_number_does_not_split_a_desync() -> None:
    def fingerprint(n: int) -> str:
        return (
            "Detected mismatch between collectives on ranks. Rank 0 is running collective: "
            f"CollectiveFingerPrint(SequenceNumber={n}OpType=BARRIER), but Rank 1 is running"
        )

    assert mask(fingerprint(30)) == mask(fingerprint(133))


def test_a_looked_through_resume_step_is_the_resume_checks_round_trip() -> None:
    from harness import looking

    step = _traceback(
        "segment_rank",
        (MINE, 170, "optimizer_step"),
        (f"{TORCH}/optim/adam.py", 456, "_single_tensor_adam"),
    )
    failure = _failure("RuntimeError", "got mixed torch.Tensor and DTensor", step, "API-4")
    try:
        with looking("CKPT-RT-1", "CKPT-RT-2"):  # the resume suite's look, in the controller
            raise failure
    except RankFailure as exc:
        looked = exc
    triage = Triage({})
    resumed = _check("test_resume", ["CKPT-RT-5", "MP-3"])
    assert triage.attribute(resumed, looked).clauses == ["CKPT-RT-5"]


def test_lists_of_names_do_not_split_a_finding() -> None:
    def state_for(names: list[str]) -> str:
        return f"TRAIN-4: 4 steps: read 1: optimizer state for {names}, the plain one for []"

    many = mask(state_for(["blocks.0.fc1.bias", "blocks.0.fc1.weight", "head.weight"]))
    assert many == mask(state_for(["inp.bias", "inp.weight", "head.bias", "head.weight"]))
    assert "optimizer state for [NAMES]" in many
    assert "['inp.bias']" in mask(state_for(["inp.bias"]))  # one name is what is wrong


def test_decimals_are_numbers_not_random_names() -> None:
    def clip(max_norm: str, factor: str) -> str:
        return f"scaled by 1 in clip(max_norm={max_norm}), torch scales by {factor} (rtol=1)"

    assert mask(clip("0.05", "0.0138267")) == mask(clip("0.001", "0.000276534"))
    assert "max_norm=N)" in mask(clip("0.05", "0.0138267"))


# --- [Note: the clause of a failure met in a method] -------------------------------------

ROUND_TRIP = ["CKPT-BUF-1", "CKPT-LOAD-2", "CKPT-RT-1", "CKPT-SAVE-4", "CKPT-STRICT-3"]
IN_LOAD = _traceback("round_trip_rank", (MINE, 377, "load_checkpoint"), (MINE, 58, "_keys"))
UNEXPECTED = "Unexpected key(s) in the checkpoint for 'model': 'scale.offset'"


def test_a_clause_block_open_on_the_rank_beats_the_methods_clause() -> None:
    triage = Triage({})
    check = _check("test_round_trip[fsdp-full]", ROUND_TRIP)
    failure = _failure("KeyError", UNEXPECTED, IN_LOAD, clause="CKPT-BUF-1")
    finding = triage.attribute(check, failure)
    assert finding.clauses == ["CKPT-BUF-1"] and check.failed_clauses == ["CKPT-BUF-1"]
    assert check.blocked_by == ""


def test_a_clause_block_open_in_the_controller_around_the_job_names_the_clause() -> None:
    from harness import clause

    try:
        with clause("CKPT-TRAINER-1"):  # the controller's block around run(...)
            raise _failure("IndexError", "tuple index out of range", IN_LOAD)
    except RankFailure as exc:
        tagged = exc
    triage = Triage({})
    check = _check("test_trainer_layout", ["CKPT-REKEY-2", "CKPT-TRAINER-1"])
    assert triage.attribute(check, tagged).clauses == ["CKPT-TRAINER-1"]
    assert check.blocked_by == ""


def test_with_no_block_open_an_untagged_load_is_the_round_trips() -> None:
    triage = Triage({})
    check = _check("test_round_trip[fsdp-full]", ROUND_TRIP)
    finding = triage.attribute(check, _failure("KeyError", UNEXPECTED, IN_LOAD))
    assert finding.clauses == ["CKPT-RT-1"] and check.blocked_by == ""


def test_a_checkpoint_method_never_breaks_a_clause_about_torchs_own_loader() -> None:
    trainer = ["CKPT-REKEY-2", "CKPT-TRAINER-1"]  # sorted, as a check holds them
    assert method_clause("load_checkpoint", trainer) == "CKPT-TRAINER-1"
    assert method_clause("save_checkpoint", trainer) == "CKPT-TRAINER-1"
    # the plain model's load_state_dict reads the file: the strategy's load blocks the check
    assert method_clause("load_checkpoint", ["CKPT-REKEY-2"]) == "CKPT-RT-1"
    assert method_clause("save_checkpoint", ["CKPT-REKEY-2"]) == "CKPT-REKEY-2"
    assert method_clause("load_checkpoint", ["CKPT-REKEY-1", "MP-3"]) == "CKPT-REKEY-1"


# --- where a failure raised in torch's code is cited ------------------------------------

C10D = f"{TORCH}/distributed/distributed_c10d.py"
MISMATCH = (
    "Detected mismatch between collectives on ranks. Rank 0 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=30OpType=BARRIER), but Rank 1 is running "
    "collective: CollectiveFingerPrint(SequenceNumber=30OpType=GATHER)"
)


def test_a_desync_is_cited_at_the_strategys_call_not_in_c10d() -> None:
    from harness.verdicts.failures import CollectiveDesync

    text = _traceback(
        "round_trip_rank",
        (MINE, 377, "load_checkpoint"),
        (MINE, 146, "_load_full_model"),
        (f"{TORCH}/distributed/c10d_logger.py", 81, "wrapper"),
        (C10D, 4811, "barrier"),
    )
    error = RemoteError("RuntimeError", MISMATCH, text, is_distributed=True)
    outcomes = [Outcome(0, "raised", error=error), Outcome(1, "raised", error=error)]
    attribution = attribute(CollectiveDesync("desync: rank 0 entered BARRIER", outcomes))
    assert attribution.where == f"{MINE}:146 _load_full_model"
    assert attribution.raised_in == "torch/distributed/distributed_c10d.py:4811 barrier"
    assert attribution.method == "load_checkpoint"


def test_an_error_raised_in_torch_is_cited_at_the_strategys_line() -> None:
    attribution = attribute(_failure("AssertionError", "", BARE_ASSERT))
    assert attribution.where == f"{MINE}:412 _load_optimizers"
    assert attribution.raised_in == "torch/distributed/tensor/placement_types.py:993 _shard_tensor"


def test_torch_called_by_a_suite_itself_is_cited_in_torch() -> None:
    text = _traceback("round_trip_rank", (f"{TORCH}/serialization.py", 1470, "load"))
    attribution = attribute(_failure("RuntimeError", "weights only load failed", text))
    assert attribution.where == "torch/serialization.py:1470 load"
    assert attribution.raised_in == ""


def test_a_strategys_own_error_has_no_raised_in() -> None:
    attribution = attribute(_failure("KeyError", UNEXPECTED, IN_LOAD))
    assert attribution.where == f"{MINE}:58 _keys" and attribution.raised_in == ""
