"""Units of clause isolation and findings: tags, masking, signatures, clause outcomes, diff."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st

from harness import clause
from harness.conformance.findings.grouping import Findings
from harness.conformance.findings.headlines import named_clause
from harness.conformance.findings.masking import mask
from harness.conformance.findings.signatures import attribute
from harness.conformance.outcomes.economy import attributed_clauses
from harness.contract import Unsupported
from harness.report import CheckResult, FindingResult, Report, clause_outcomes
from harness.report.diff import diff_reports
from harness.run.remembered import RememberedRefusals
from harness.verdicts.attribution import clause_of, take_late_violations


def test_clause_tags_what_its_body_raises_innermost_first() -> None:
    with pytest.raises(RuntimeError) as info, clause("API-2"), clause("API-8"):
        raise RuntimeError("boom")
    assert clause_of(info.value) == "API-8"


def test_clause_never_tags_unsupported() -> None:
    with pytest.raises(Unsupported) as info, clause("API-1"):
        raise Unsupported("no", "family", "fsdp")
    assert clause_of(info.value) == ""


def test_clause_after_records_instead_of_raising() -> None:
    take_late_violations()
    with clause("API-8", after=True):
        raise RuntimeError("teardown: checkpoint_io is not implemented")
    (late,) = take_late_violations()
    assert late.clause == "API-8"
    assert late.type_name == "RuntimeError"
    assert "checkpoint_io" in late.message and "Traceback" in late.traceback
    assert take_late_violations() == ()


def test_clause_refuses_an_empty_id() -> None:
    with pytest.raises(ValueError, match="clause id"), clause(""):
        pass


def test_mask_hides_numbers_shapes_paths_and_addresses_but_not_names() -> None:
    text = "rank 3: blocks.0.fc1.bias [2, 3] at 0x7fab /tmp/x/y.pt by 1.5e-3; 12 of 40\nmore"
    assert mask(text) == "rank N: blocks.0.fc1.bias SHAPE at 0x? PATH by N; N of N"


def test_mask_makes_one_error_of_any_two_meshes_and_drops_colour_codes() -> None:
    one_way = (
        "must have the same mesh, but got DeviceMesh((data_parallel=1), 'cpu', stride=((),)) "
        "and DeviceMesh((data_parallel=1, tensor_parallel=4), 'cpu', stride=((), 1))."
    )
    other_way = (
        "must have the same mesh, but got DeviceMesh((data_parallel=2, tensor_parallel=3), "
        "'cpu', stride=((), 1)) and DeviceMesh((data_parallel=1), 'cpu', stride=((),))."
    )
    assert mask(one_way) == mask(other_way) == "must have the same mesh, but got MESH and MESH."
    assert mask("Weights only load failed. \x1b[1mdo those steps\x1b[0m.") == (
        "Weights only load failed. do those steps."
    )


def test_named_clause_reads_the_clause_an_assertion_starts_with() -> None:
    assert named_clause("CKPT-RT-1: rank 0, saved at world size 2") == "CKPT-RT-1"
    assert named_clause("rank 1: CLIP-1: norm differs") == "CLIP-1"
    assert named_clause("parameter differs") == ""


def _strategy_call(message: str) -> None:
    raise RuntimeError(message)  # one place, as a strategy's method would be


def _raise_tagged(message: str, clause_id: str = "") -> BaseException:
    try:
        if clause_id:
            with clause(clause_id):
                _strategy_call(message)
        else:
            _strategy_call(message)
    except RuntimeError as exc:
        return exc
    raise AssertionError("unreachable")


def test_one_error_at_one_place_is_one_finding_across_checks() -> None:
    findings = Findings()
    for n, check in enumerate(["a[fsdp]", "b[fsdp]", "c[model_parallel]"]):
        attribution = attribute(_raise_tagged(f"optimizer_step failed at step {n}", "API-4"))
        clauses, blocked_by = attributed_clauses(["TRAIN-1"], attribution)
        assert (clauses, blocked_by) == (["API-4"], "API-4")
        findings.record(attribution, clauses, check)
    (finding,) = findings
    assert finding.id == "F1" and finding.checks == ["a[fsdp]", "b[fsdp]", "c[model_parallel]"]
    assert finding.signature.startswith("API-4: RuntimeError: optimizer_step failed at step N @ ")


def test_an_untagged_error_at_a_known_place_joins_that_finding() -> None:
    findings = Findings()
    tagged = attribute(_raise_tagged("optimizer_step failed", "API-4"))
    findings.record(tagged, ["API-4"], "first")
    untagged = attribute(_raise_tagged("optimizer_step failed"))
    assert untagged.clause == "" and untagged.place == tagged.place
    assert findings.resolve(untagged).clause == "API-4"
    other = attribute(_raise_tagged("another error"))
    assert findings.resolve(other).clause == ""


def test_a_failure_of_one_of_the_checks_clauses_is_attributed_to_it_alone() -> None:
    attribution = attribute(AssertionError("CKPT-RT-1: rank 0: optimizer state differs"))
    assert attribution.kind == "assertion"
    assert attributed_clauses(["CKPT-BUF-1", "CKPT-RT-1"], attribution) == (["CKPT-RT-1"], "")


def test_clause_outcomes_count_a_check_only_for_the_clause_its_failure_broke() -> None:
    checks = [
        CheckResult("rt", ["CKPT-BUF-1", "CKPT-RT-1"], "failed", finding="F1",
                    attributed_to=["CKPT-RT-1"]),
        CheckResult("sync", ["SYNC-1"], "blocked", finding="F2", attributed_to=["API-8"]),
        CheckResult("clip", ["CLIP-1"], "passed"),
    ]  # fmt: skip
    findings = [
        FindingResult("F1", ["CKPT-RT-1"], "s1", "m1", checks=["rt"]),
        FindingResult("F2", ["API-8"], "s2", "m2", checks=["sync"]),
    ]
    outcomes = {c: o for c, (o, _) in clause_outcomes(checks, findings).items()}
    assert outcomes == {
        "API-8": "failed",
        "CKPT-BUF-1": "blocked",
        "CKPT-RT-1": "failed",
        "CLIP-1": "passed",
        "SYNC-1": "blocked",
    }


def test_report_round_trips_findings_and_diff_lists_new_ones() -> None:
    check = CheckResult("clip", ["CLIP-1"], "failed", finding="F1", attributed_to=["CLIP-1"])
    finding = FindingResult("F1", ["CLIP-1"], "CLIP-1: AssertionError: N", "m", checks=["clip"])
    new = Report("0", {}, {}, [check], findings=[finding])
    again = Report.from_dict(new.to_dict())
    assert again.findings == [finding] and again.checks[0].finding == "F1"
    old = Report("0", {}, {}, [CheckResult("clip", ["CLIP-1"], "passed")])
    diff = diff_reports(old, again)
    assert diff.findings_new == [("CLIP-1", "CLIP-1: AssertionError: N")]
    assert diff.findings_gone == []


def test_refusals_are_remembered_per_family_and_option_value() -> None:
    refusals = RememberedRefusals()
    options = {"precision": "16-true", "extra": {"cpu_offload": True}}
    refusals.remember("fsdp", options, Unsupported("no offload here", "cpu_offload", True))
    # the check that learned it does not use it: its examples must replay alike
    assert refusals.refused("fsdp", options) is None
    refusals.begin_check()
    again = refusals.refused("fsdp", {"precision": "32-true", "extra": {"cpu_offload": True}})
    assert again is not None and again.option == "cpu_offload"
    assert refusals.refused("model_parallel", options) is None
    assert refusals.refused("fsdp", {"precision": "16-true"}) is None
    # a refusal naming no option (a combination) is not remembered
    refusals.remember("fsdp", options, Unsupported("not this combination"))
    refusals.begin_check()
    assert refusals.refused("fsdp", {"precision": "16-true"}) is None


def test_a_rank_error_reported_by_a_suite_is_attributed_where_it_was_raised() -> None:
    text = (
        "rank 0: NotImplementedError: no CheckpointIO here\n"
        "fsdp api8 raised on the ranks:\n"
        'rank 0: Traceback (most recent call last):\n  File "/x/strategies/mine.py", line 9, '
        "in checkpoint_io\n    raise NotImplementedError\n"
    )
    failure = pytest.fail.Exception(text, pytrace=False)
    attribution = attribute(failure)
    assert attribution.kind == "raised"
    assert attribution.type_name == "NotImplementedError"
    assert attribution.where.endswith("mine.py:9 checkpoint_io")


def _budgeted_test(draws_in_body: bool, calls: list[int]) -> tuple[Any, Any]:
    """A Hypothesis test that always fails, wrapped like a conformance check with a spent
    (zero-second) shrink budget, and its check; ``calls`` counts the examples its body ran."""
    from hypothesis import Verbosity, given, settings
    from hypothesis import strategies as st

    from harness.conformance.outcomes.checks import Check
    from harness.conformance.outcomes.economy import ShrinkPolicy
    from harness.conformance.outcomes.unsupported import rejecting

    check = Check(id="t::budget", nodeid="t.py::budget", clauses=["API-1"])
    policy = ShrinkPolicy(0.0, Findings())

    def body(n: int, data: Any = None) -> None:
        calls[0] += 1
        if data is not None:
            data.draw(st.integers(0, 1000))
        raise AssertionError("API-1: always")

    if draws_in_body:

        @settings(max_examples=50, database=None, derandomize=True, verbosity=Verbosity.normal)
        @given(st.integers(0, 1000), st.data())
        def test(n: int, data: Any) -> None:
            body(n, data)

    else:

        @settings(max_examples=50, database=None, derandomize=True, verbosity=Verbosity.normal)
        @given(st.integers(0, 1000))
        def test(n: int) -> None:
            body(n)

    handle: Any = test.hypothesis  # type: ignore[attr-defined]
    handle.inner_test = rejecting(handle.inner_test, check, policy)
    return test, check


@pytest.mark.parametrize("draws_in_body", [False, True])
def test_a_spent_shrink_budget_ends_the_search_without_inconsistent_data(
    draws_in_body: bool,
) -> None:
    from hypothesis.reporting import with_reporter

    from harness.run.shrinking import quiet_slow_shrinking

    calls = [0]
    reported: list[object] = []
    test, check = _budgeted_test(draws_in_body, calls)
    with with_reporter(reported.append), quiet_slow_shrinking():
        with pytest.raises(AssertionError, match="API-1: always"):
            test()
    # unbudgeted, Hypothesis shrinks an integer and a draw over hundreds of examples; spent,
    # the search ends after the first failure (one more run for a test drawing in its body),
    # then the failing example is replayed for the report
    assert calls[0] <= 3, calls[0]
    assert check.search_ended
    # Hypothesis' "spent more than five minutes" warning is not true of a budget stop
    assert not [r for r in reported if "five minutes" in str(r)], reported


def test_a_spent_shrink_budget_ends_a_state_machines_search_at_its_next_job() -> None:
    from hypothesis import Verbosity, settings
    from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

    from harness.conformance.outcomes.checks import Check
    from harness.conformance.outcomes.economy import ShrinkPolicy

    check = Check(id="t::machine", nodeid="t.py::machine", clauses=["CKPT-RT-5"])
    policy = ShrinkPolicy(0.0, Findings())
    steps = [0]

    class AlwaysFails(RuleBasedStateMachine):
        @rule(n=st.integers(0, 100))
        def step(self, n: int) -> None:
            policy.before_job(check)  # what run_on_ranks' job guard calls before each job
            steps[0] += 1
            raise AssertionError("CKPT-RT-5: always")

    with pytest.raises(AssertionError, match="CKPT-RT-5: always"):
        run_state_machine_as_test(
            AlwaysFails,
            settings=settings(
                max_examples=50, database=None, derandomize=True, verbosity=Verbosity.quiet
            ),
        )
    # unbudgeted, Hypothesis shrinks the step's integer over dozens of examples
    assert check.search_ended
    assert steps[0] <= 3, steps[0]


def test_of_several_failures_the_one_breaking_the_checks_own_clause_is_its_verdict() -> None:
    from hypothesis.errors import FlakyFailure

    blocked_on_the_way = RuntimeError("meshes differ")
    blocked_on_the_way.__notes__ = []
    with pytest.raises(RuntimeError) as tagged:
        with clause("CLIP-1"):
            raise blocked_on_the_way
    own = AssertionError("CKPT-SAVE-6: the old checkpoint changed on disk")
    flaky = FlakyFailure("passed when replayed", [AssertionError("CKPT-SAVE-6: once")])
    # Hypothesis' "found N distinct failures" group: a builtin from Python 3.11, a backport before
    import builtins

    group_type = getattr(builtins, "ExceptionGroup", None)
    if group_type is None:
        group_type = pytest.importorskip("exceptiongroup").ExceptionGroup
    group = group_type("distinct failures", [flaky, tagged.value, own])
    assert attribute(group, ["CKPT-SAVE-6"]).message == own.args[0]
    # none of its own: the first steady failure (not the flaky one) is what blocked it
    assert attribute(group, ["CKPT-RT-1"]).clause == "CLIP-1"


def test_a_finding_met_late_after_failing_its_own_check_counts_as_late() -> None:
    from harness.conformance.findings.signatures import Attribution
    from harness.conformance.outcomes.triage import Triage

    triage = Triage({"API-8": "teardown raises"})
    teardown = Attribution("API-8", "raised", "NotImplementedError", "no io", "s.py:9 io", "no io")
    assert triage.late_unmatched() == ["finding:API-8"]
    # API-8's own check fails on it first (listed as an expected failure), then other checks
    # meet it after their property: the 'finding:API-8' line is matched
    first = triage.findings.record(teardown, ["API-8"], "test_api.test_teardown")
    assert not first.seen_late and triage.late_unmatched() == ["finding:API-8"]
    triage.findings.record(teardown, ["API-8"], "test_training.test_x", late=True)
    assert first.seen_late and triage.late_unmatched() == []


def test_hypothesis_slow_shrinking_warning_is_never_shown() -> None:
    from hypothesis.reporting import report, with_reporter

    from harness.run.shrinking import quiet_slow_shrinking

    reported: list[object] = []
    with with_reporter(reported.append), quiet_slow_shrinking():
        report("WARNING: Hypothesis has spent more than five minutes working to shrink ...")
        report("Falsifying example: f(x=1)")
    assert reported == ["Falsifying example: f(x=1)"]
