"""One root cause, one finding: a wrong value reported alike by checks of several clauses, a
failure met looking through another clause's method, and no early stop on a wrong value."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from harness import clause, looking
from harness.conformance.findings.masking import difference
from harness.conformance.outcomes.checks import Check
from harness.conformance.outcomes.triage import Triage
from harness.contract import Unsupported
from harness.verdicts.attribution import looked_through
from suites.lib.controller.checkpoint_checks import assert_same_optim


def _optim(name: str, value: float) -> dict[str, Any]:
    return {"state": {name: {"exp_avg": torch.full((4,), value)}}, "param_groups": [{"lr": 1.0}]}


def _round_trip_failure(clause_id: str, where: str, name: str) -> BaseException:
    """What a round-trip check of a load that drops the optimizer state raises (the suites'
    own comparison, so it is a suite's assertion)."""
    actual, expected = _optim(name, 0.0), _optim(name, 1.0)
    exc = _caught(lambda: assert_same_optim(actual, expected, clause=clause_id, where=where))
    # raised in a suite's check, every frame is shardcheck's own; here this file's frames
    # would count as the strategy's, so the traceback goes
    return exc.with_traceback(None)


RT1 = ("CKPT-RT-1", "rank 0, saved at world size 1 (fsdp, full)", "blocks.0.attn.wk.bias")
RT2 = ("CKPT-RT-2", "rank 0, saved at world size 2 (model_parallel, sharded)", "blocks.0.fc1.bias")
RT3 = ("CKPT-RT-3", "load rank 1, saved at world size 2, loaded at 4 (fsdp)", "inp.weight")


def _caught(body: Any) -> BaseException:
    try:
        body()
    except BaseException as exc:
        return exc
    raise AssertionError("the body raised nothing")


def _assert(message: str) -> None:
    raise AssertionError(message)


def _check(check_id: str, *clauses: str) -> Check:
    return Check(id=check_id, nodeid=check_id, clauses=list(clauses))


def test_difference_keeps_only_the_wrong_value_with_deeper_keys_folded() -> None:
    expected = "optimizer['state'][…]: N of N elements differ from what was saved"
    messages = [str(_round_trip_failure(*rt)) for rt in (RT1, RT2, RT3)]
    assert messages[0].startswith("CKPT-RT-1: rank 0, saved at world size 1 (fsdp, full): ")
    assert {difference(m) for m in messages} == {expected}
    assert difference("model['fc.weight']: torch.float32(4,) where torch.bfloat16(4,) was saved")
    assert difference("TRAIN-4: rank 0 (fsdp), the end: optimizer state for [], the plain") == ""


def test_one_wrong_value_in_checks_of_three_clauses_is_one_finding_listing_each() -> None:
    triage = Triage({})
    checks = [
        _check("test_roundtrip[full]", "CKPT-RT-1"),
        _check("test_roundtrip[sharded]", "CKPT-RT-2", "CKPT-LOAD-2"),
        _check("test_reshard[2to4]", "CKPT-RT-3"),
    ]
    findings = [
        triage.attribute(check, _round_trip_failure(*rt))
        for check, rt in zip(checks, (RT1, RT2, RT3), strict=True)
    ]
    assert {f.id for f in findings} == {"F1"}
    assert findings[0].clauses == ["CKPT-RT-1", "CKPT-RT-2", "CKPT-RT-3"]
    assert [c.blocked_by for c in checks] == ["", "", ""]  # failed, not blocked
    assert [c.failed_clauses for c in checks] == [["CKPT-RT-1"], ["CKPT-RT-2"], ["CKPT-RT-3"]]


def test_looking_marks_what_escapes_even_under_an_inner_clause() -> None:
    def look() -> None:
        with looking("CKPT-RT-1", "CKPT-RT-2"), clause("TRAIN-4"):
            _assert("TRAIN-4: rank 0, the end: optimizer state for []")

    def unsupported() -> None:
        with looking("CKPT-RT-1"):
            raise Unsupported("no hybrid", "sharding_strategy", "HYBRID_SHARD")

    assert looked_through(_caught(look)) == ("CKPT-RT-1", "CKPT-RT-2")
    assert looked_through(_caught(unsupported)) == ()
    with pytest.raises(ValueError, match="clause ids of the methods looked through"):
        with looking():
            pass


def test_a_failure_tagged_with_another_clause_while_looking_is_blocked_by_that_clause() -> None:
    triage = Triage({})
    round_trip = _check("test_roundtrip[full]", "CKPT-RT-1")
    triage.attribute(round_trip, _round_trip_failure(*RT1))

    def setup_fails() -> None:
        with looking("CKPT-RT-1"), clause("API-2"):
            raise RuntimeError("setup_module cannot wrap Sequential")

    session = _check("test_training_session[fsdp]", "TRAIN-4")
    finding = triage.attribute(session, _caught(setup_fails))
    assert session.blocked_by == "API-2" and finding.clauses == ["API-2"]


def test_a_failure_looking_through_a_broken_load_is_blocked_by_its_finding() -> None:
    triage = Triage({})
    round_trip = _check("test_roundtrip[full]", "CKPT-RT-1")
    load_bug = triage.attribute(round_trip, _round_trip_failure(*RT1))

    def session_look() -> None:  # the session's reads are tagged with its own clause
        with looking("CKPT-RT-1", "CKPT-RT-2"), clause("TRAIN-4"):
            _assert("TRAIN-4: rank 0 of 2 (fsdp), 1 steps, the end: optimizer state for []")

    session = _check("test_training_session[fsdp]", "TRAIN-4", "CKPT-RT-6")
    finding = triage.attribute(session, _caught(session_look))
    assert finding is load_bug
    assert session.blocked_by == "CKPT-RT-1" and session.failed_clauses == ["CKPT-RT-1"]
    assert load_bug.clauses == ["CKPT-RT-1"]  # TRAIN-4 is not blamed
    assert load_bug.checks == ["test_roundtrip[full]", "test_training_session[fsdp]"]
    session.settle("failed", "AssertionError: TRAIN-4: ...")
    assert session.outcome == "blocked"


def test_a_failure_looking_through_a_load_nobody_found_broken_is_the_checks_own() -> None:
    triage = Triage({})

    def session_look() -> None:
        with looking("CKPT-RT-1", "CKPT-RT-2"):
            _assert("TRAIN-4: rank 0 of 2 (fsdp), after freezing: parameter differs")

    session = _check("test_training_session[fsdp]", "TRAIN-4")
    finding = triage.attribute(session, _caught(session_look))
    assert finding.clauses == ["TRAIN-4"] and session.blocked_by == ""


def test_a_wrong_value_in_the_first_checks_does_not_stop_the_run() -> None:
    class Session:
        shouldfail: bool | str = False

    triage = Triage({})
    triage.session = Session()  # type: ignore[assignment]
    for i in range(4):
        check = _check(f"test_roundtrip[{i}]", "CKPT-RT-1")
        failure = _round_trip_failure(*RT1)
        triage.attribute(check, failure)
        check.settle("failed", str(failure))
        triage.finished(check)
    assert triage.session.shouldfail is False


def test_an_error_raised_in_the_first_checks_still_stops_the_run() -> None:
    class Session:
        shouldfail: bool | str = False

    def setup_raises() -> None:
        with clause("API-2"):
            raise RuntimeError("setup_module cannot wrap Sequential")

    triage = Triage({})
    triage.session = Session()  # type: ignore[assignment]
    for i in range(3):
        check = _check(f"test_api[{i}]", "API-1")
        triage.attribute(check, _caught(setup_raises))
        check.settle("failed", "RuntimeError: setup_module cannot wrap Sequential")
        triage.finished(check)
    assert "all failed with finding F1" in str(triage.session.shouldfail)


def test_a_desync_met_by_both_families_is_one_finding_at_the_strategys_collective() -> None:
    from harness.verdicts.failures import CollectiveDesync
    from harness.verdicts.outcomes import Outcome, RemoteError

    def desync(family: str) -> BaseException:
        caught = RemoteError(
            "RuntimeError",
            "the job caught a collective mismatch and went on: Detected mismatch between "
            "collectives on ranks. Rank 0 is running collective: BARRIER",
            "",  # made by the harness, never raised: no traceback
        )
        story = (
            f"job 7 ({family}): desync: the ranks entered collectives that do not match\n"
            "  rank 0 entered BARRIER at /src/my_strategy.py:23 in load_checkpoint\n"
            "  rank 1 entered BROADCAST shapes=[1] at /src/my_strategy.py:90 in _broadcast"
        )
        return CollectiveDesync(story, [Outcome(0, "raised", error=caught), Outcome(1, "ok")])

    triage = Triage({})
    fsdp = _check("test_strict[fsdp]", "CKPT-STRICT-2")
    mp = _check("test_strict[model_parallel]", "CKPT-STRICT-2", "MP-3")
    first = triage.attribute(fsdp, desync("fsdp"))
    second = triage.attribute(mp, desync("model_parallel"))
    assert first is second and first.attribution.where == "/src/my_strategy.py:23 load_checkpoint"
    assert first.clauses == ["CKPT-STRICT-2", "MP-3"]


def test_a_known_failure_ends_a_state_machines_search_at_its_next_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from harness.conformance.findings.grouping import Findings
    from harness.conformance.outcomes import economy

    ended: list[bool] = []
    monkeypatch.setattr(economy, "stop_after_this_example", lambda: ended.append(True) or True)
    policy = economy.ShrinkPolicy(None, Findings())  # no budget: nightly's
    machine = _check("test_training_session[fsdp]", "TRAIN-4")
    policy.before_job(machine)
    assert ended == [] and not machine.search_ended  # nothing known: it goes on
    machine.stop_shrinking = True  # its failure was filed under a known finding
    policy.before_job(machine)
    assert ended == [True] and machine.search_ended


def test_a_state_machines_look_that_a_finding_explains_ends_its_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from harness.conformance.outcomes import economy
    from harness.conformance.outcomes.unsupported import CheckWatch
    from harness.verdicts.attribution import last_looked_failure

    triage = Triage({})
    triage.attribute(_check("test_roundtrip[full]", "CKPT-RT-1"), _round_trip_failure(*RT1))
    ended: list[bool] = []
    monkeypatch.setattr(economy, "stop_after_this_example", lambda: ended.append(True) or True)
    monkeypatch.setattr(economy, "first_failure_time", lambda: 1.0)  # the engine found one
    machine = _check("test_training_session[fsdp]", "TRAIN-4")
    watch = CheckWatch(machine, triage.policy)  # a new check forgets earlier looks
    assert last_looked_failure() is None

    def session_look() -> None:
        with looking("CKPT-RT-1", "CKPT-RT-2"), clause("TRAIN-4"):
            _assert("TRAIN-4: rank 0 of 2 (fsdp), the end: optimizer state for []")

    _caught(session_look)  # the machine's invariant failed; Hypothesis goes on shrinking
    watch.before_job()
    assert machine.stop_shrinking and machine.search_ended and ended == [True]


def test_a_rank_that_crashed_inside_a_load_is_blocked_by_a_known_round_trip_finding() -> None:
    from harness.verdicts.outcomes import Outcome, RankFailure

    dump = (  # what faulthandler wrote for the SIGABRT met by the load bug (frames cut)
        "Fatal Python error: Aborted\n\n"
        "Thread 0x00007fea3be20b80 (most recent call first):\n"
        '  File "/venv/torch/distributed/_functional_collectives.py", line 142 in wait_tensor\n'
        '  File "/venv/torch/distributed/checkpoint/state_dict.py", line 1478 in set_state\n'
        '  File "/src/my_strategy.py", line 73 in load_checkpoint\n'
        '  File "/repo/suites/lib/ranks/checkpoint_jobs.py", line 281 in round_trip_rank\n'
    )

    def crash(stacks: str) -> BaseException:
        outcomes = [Outcome(0, "ok"), Outcome(1, "crashed", exitcode=-6, stacks=stacks)]
        return RankFailure("job 9: rank 1 crashed", outcomes)

    whole_space = ("CKPT-RT-2", "CKPT-SAVE-4", "TRAIN-1")
    triage = Triage({})
    first = _check("test_whole_space[a]", *whole_space)
    alone = triage.attribute(first, crash(dump))  # nothing known yet: the check's own crash
    assert alone.clauses == list(whole_space) and first.blocked_by == ""

    triage = Triage({})
    load_bug = triage.attribute(
        _check("test_roundtrip[full]", "CKPT-RT-1"), _round_trip_failure(*RT1)
    )
    check = _check("test_whole_space[b]", *whole_space)
    assert triage.attribute(check, crash(dump)) is load_bug
    assert check.blocked_by == "CKPT-RT-1" and load_bug.clauses == ["CKPT-RT-1"]
    elsewhere = _check("test_whole_space[c]", *whole_space)
    other = triage.attribute(elsewhere, crash(dump.replace("load_checkpoint", "setup_module")))
    assert other is not load_bug and elsewhere.blocked_by == ""


def test_the_same_wrong_value_past_two_precisions_tolerances_is_one_finding() -> None:
    from suites.lib.controller.oracles import assert_close
    from suites.lib.controller.tolerances import Tolerance

    def compare(reason: str) -> BaseException:
        tol = Tolerance(1e-3, 1e-3, reason=reason)
        actual, expected = torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0])
        body = lambda: assert_close(actual, expected, tol, name="CLIP-1: rank 0: clip norms")  # noqa: E731
        return _caught(body).with_traceback(None)

    triage = Triage({})
    checks = [_check("test_space[bf16]", "CLIP-1", "TRAIN-1"), _check("test_space[fp16]", "CLIP-1")]
    reasons = ("bf16 keeps 8 mantissa bits", "fp16 keeps 11 mantissa bits")
    findings = [triage.attribute(c, compare(r)) for c, r in zip(checks, reasons, strict=True)]
    assert [f.id for f in findings] == ["F1", "F1"]
    assert findings[0].clauses == ["CLIP-1"]
