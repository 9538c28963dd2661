"""Each outcome, from the fake suite's test to the report: passed, failed, error, unsupported,
environment, xfailed (from an expected-failures file), and the Hypothesis cases."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.conformance.conftest import Run

RunSuite = Callable[..., "Run"]

BASIC = """
import pytest
from harness import Unsupported

@pytest.mark.clause("API-1")
@pytest.mark.parametrize("n", [1, 2], ids=["ws1", "ws2"])
def test_pass(n):
    pass

@pytest.mark.clause("CKPT-RT-2", "CLIP-1")
def test_fail():
    assert {"lr": 1} == {"lr": 2}

@pytest.mark.clause("CFG-1")
def test_unsupported():
    raise Unsupported("no hybrid sharding here", "sharding_strategy", "HYBRID_SHARD")

@pytest.mark.clause("CFG-6")
def test_environment():
    pytest.skip("environment: needs 4 GPUs, found 0")

@pytest.mark.clause("CFG-2")
def test_unclassified_skip():
    pytest.skip("for no stated reason")
"""


def test_each_outcome_is_reported(run_suite: RunSuite) -> None:
    run = run_suite(BASIC)
    run.result.assert_outcomes(passed=2, failed=1, skipped=3)
    assert run.ret == 1
    assert run.outcomes() == {
        "test_fake.test_pass[ws1]": "passed",
        "test_fake.test_pass[ws2]": "passed",
        "test_fake.test_fail": "failed",
        "test_fake.test_unsupported": "unsupported",
        "test_fake.test_environment": "environment",
        "test_fake.test_unclassified_skip": "error",
    }
    assert run.check("test_fake.test_unsupported")["failure"] == (
        "unsupported: sharding_strategy=HYBRID_SHARD (no hybrid sharding here)"
    )
    assert run.check("test_fake.test_environment")["failure"] == (
        "environment: needs 4 GPUs, found 0"
    )
    assert "assert {'lr': 1} == {'lr': 2}" in run.check("test_fake.test_fail")["failure"]
    assert "without a classified reason" in run.check("test_fake.test_unclassified_skip")["failure"]
    assert run.check("test_fake.test_pass[ws1]")["failure"] is None


def test_clause_takes_the_worst_outcome_and_summary_names_it(run_suite: RunSuite) -> None:
    run = run_suite(BASIC)
    clauses = run.report()["clauses"]
    assert clauses == {
        "API-1": "passed",
        "CFG-1": "unsupported",
        "CFG-2": "error",
        "CFG-6": "environment",
        "CKPT-RT-2": "failed",
        "CLIP-1": "failed",
    }
    run.result.stdout.fnmatch_lines(
        [
            "*shardcheck conformance*",
            "checks: 2 passed, 1 failed, 1 error, 1 unsupported, 1 environment"
            " (6 checks, 6 clauses)",
            "  CFG-1 * unsupported * test_fake.test_unsupported: unsupported: sharding_strategy=*",
            "  CKPT-RT-2 * failed * test_fake.test_fail: F1: assert {*",
        ]
    )


SETUP_TEARDOWN = """
import pytest
from harness import Unsupported

@pytest.fixture
def broken_setup():
    raise RuntimeError("fixture could not build the model")

@pytest.fixture
def refused():
    raise Unsupported("no CPU offload without an accelerator", "cpu_offload", True)

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown leaked a process group")

@pytest.mark.clause("API-2")
def test_setup_error(broken_setup):
    pass

@pytest.mark.clause("CFG-6")
def test_fixture_unsupported(refused):
    pass

@pytest.mark.clause("API-8")
def test_teardown_error(broken_teardown):
    pass

@pytest.mark.clause("API-5")
def test_fails_and_teardown_errors(broken_teardown):
    assert 1 == 2
"""


def test_setup_and_teardown_problems(run_suite: RunSuite) -> None:
    run = run_suite(SETUP_TEARDOWN)
    assert run.outcomes() == {
        "test_fake.test_setup_error": "error",
        "test_fake.test_fixture_unsupported": "unsupported",
        "test_fake.test_teardown_error": "error",
        "test_fake.test_fails_and_teardown_errors": "failed",
    }
    assert run.check("test_fake.test_setup_error")["failure"].startswith("setup failed: ")
    assert "fixture could not build" in run.check("test_fake.test_setup_error")["failure"]
    assert run.check("test_fake.test_teardown_error")["failure"].startswith("teardown failed: ")
    assert run.check("test_fake.test_fixture_unsupported")["failure"] == (
        "unsupported: cpu_offload=True (no CPU offload without an accelerator)"
    )


def test_a_module_that_does_not_import_is_an_error_check(run_suite: RunSuite) -> None:
    good = "import pytest\n\n@pytest.mark.clause('API-1')\ndef test_ok():\n    pass\n"
    run = run_suite(None, files={"test_good.py": good, "test_broken.py": "import not_a_module\n"})
    assert run.ret == 2  # pytest stops on collection errors; the report is written anyway
    assert run.outcomes()["test_broken"] == "error"
    assert "not_a_module" in run.check("test_broken")["failure"]


HYPOTHESIS = """
import hypothesis
import pytest
from hypothesis import given, settings, strategies as st
from harness import Unsupported
from harness.conformance import record_unsupported, skip_or_reject_unsupported

fast = settings(max_examples=25, database=None, derandomize=True, print_blob=True)

@pytest.mark.clause("TRAIN-1")
@fast
@given(st.integers(0, 20))
def test_some_unsupported(n):
    if n % 2:
        raise Unsupported("odd sizes are not sharded", "size", n)

@pytest.mark.clause("PREC-2")
@fast
@given(st.sampled_from(["16-mixed", "bf16-mixed"]))
def test_all_unsupported(precision):
    raise Unsupported("no mixed precision", "precision", precision)

@pytest.mark.clause("PREC-3")
@fast
@given(st.integers(0, 20))
def test_explicit_record_and_reject(n):
    try:
        raise Unsupported("never", "precision", "16-true")
    except Unsupported as exc:
        record_unsupported(exc)
        hypothesis.reject()

def run_like_the_suites(n):
    try:
        raise Unsupported("no hybrid", "sharding_strategy", "HYBRID_SHARD")
    except Unsupported:
        if hypothesis.currently_in_test_context():
            hypothesis.reject()
        raise

@pytest.mark.clause("SHARD-1")
@fast
@given(st.integers(0, 20))
def test_suite_catches_and_rejects(n):
    run_like_the_suites(n)

@pytest.mark.clause("TRAIN-2")
@fast
@given(st.integers(0, 20))
@hypothesis.example(-1)
def test_only_the_explicit_example_is_offered(n):
    if n >= 0:  # a family the strategy does not offer: every draw refused
        raise Unsupported("only the other family", "size", n)

@pytest.mark.clause("SHARD-2")
@fast
@given(st.integers(0, 20))
def test_nothing_satisfiable(n):
    hypothesis.assume(False)

@pytest.mark.clause("TRAIN-3")
@fast
@given(st.integers(0, 20))
def test_failing_example(n):
    assert n < 7

@pytest.mark.clause("CFG-10")
def test_helper_outside_hypothesis():
    with skip_or_reject_unsupported():
        raise Unsupported("no meshes", "device_mesh", (2, 2))
"""


def test_hypothesis_unsupported_examples(run_suite: RunSuite) -> None:
    run = run_suite(HYPOTHESIS)
    outcomes = run.outcomes()
    assert outcomes["test_fake.test_some_unsupported"] == "passed"
    # its explicit example passed and every draw was refused: passed on what it offers
    assert outcomes["test_fake.test_only_the_explicit_example_is_offered"] == "passed"
    offered = run.check("test_fake.test_only_the_explicit_example_is_offered")
    assert offered["unsupported"] and "size=" in offered["unsupported"][0]
    assert outcomes["test_fake.test_all_unsupported"] == "unsupported"
    assert outcomes["test_fake.test_explicit_record_and_reject"] == "unsupported"
    assert outcomes["test_fake.test_failing_example"] == "failed"
    assert outcomes["test_fake.test_helper_outside_hypothesis"] == "unsupported"
    assert outcomes["test_fake.test_suite_catches_and_rejects"] == "unsupported"
    assert run.check("test_fake.test_suite_catches_and_rejects")["failure"] == (
        "unsupported: sharding_strategy=HYBRID_SHARD (no hybrid)"
    )
    # the suite's own filter rejected everything: the suite is broken, not the strategy
    assert outcomes["test_fake.test_nothing_satisfiable"] == "error"
    reason = run.check("test_fake.test_all_unsupported")["failure"]
    assert reason.startswith("unsupported: precision=")
    assert "16-mixed" in reason and "bf16-mixed" in reason  # both configurations named
    assert run.check("test_fake.test_explicit_record_and_reject")["failure"] == (
        "unsupported: precision=16-true (never)"
    )
    assert run.check("test_fake.test_helper_outside_hypothesis")["failure"] == (
        "unsupported: device_mesh={2, 2} (no meshes)"
    )


def test_hypothesis_failure_has_example_and_blob_in_reproducer(run_suite: RunSuite) -> None:
    run = run_suite(HYPOTHESIS)
    check = run.check("test_fake.test_failing_example")
    # Hypothesis says "Falsifying example" up to 6.16x and "Failing test case" after
    assert re.search(
        r"(Falsifying example|Failing test case): test_failing_example\(", check["failure"]
    )
    assert "n=7" in check["failure"]
    assert check["reproducer"].startswith("pytest test_fake.py::test_failing_example ")
    option = check["reproducer"].split()[-1]
    assert option.startswith("--reproduce-failure=") and "@reproduce_failure" not in option
    # the reproducer's option replays that example with no edit to the test file
    replay = run_suite(None, "test_fake.py::test_failing_example", option)
    assert replay.outcomes() == {"test_fake.test_failing_example": "failed"}
    assert "assert 7 < 7" in replay.check("test_fake.test_failing_example")["failure"]  # n=7


EXPECTED = """
import pytest

@pytest.mark.clause("CKPT-RT-3")
@pytest.mark.parametrize("ws", [2, 4], ids=["ws2", "ws4"])
def test_reshard(ws):
    assert ws == 2, "optimizer state lost when resharding"

@pytest.mark.clause("CLIP-1")
def test_clip():
    pass
"""

EXPECTED_FILE = """\
# known failures of our strategy
test_fake.test_reshard[ws4]   optimizer state is dropped (issue 12)

test_fake.test_clip           thought broken, but fixed
test_fake.test_gone           this test was renamed
"""


def test_expected_failures_file(run_suite: RunSuite) -> None:
    run = run_suite(
        EXPECTED, "--expected-failures", "xfail.txt", files={"xfail.txt": EXPECTED_FILE}
    )
    run.result.assert_outcomes(passed=1, xfailed=1, failed=1)
    assert run.outcomes() == {
        "test_fake.test_reshard[ws2]": "passed",
        "test_fake.test_reshard[ws4]": "xfailed",
        "test_fake.test_clip": "failed",  # a strict xpass
    }
    xfail = run.check("test_fake.test_reshard[ws4]")["failure"]
    assert "optimizer state is dropped (issue 12)" in xfail
    assert "optimizer state lost when resharding" in xfail
    assert "strict xpass" in run.check("test_fake.test_clip")["failure"]
    assert run.report()["expected_failures"]["unmatched"] == ["test_fake.test_gone"]
    run.result.stdout.fnmatch_lines(
        ["--expected-failures: 1 ids matched no test: test_fake.test_gone"]
    )


@pytest.mark.parametrize(
    ("content", "match"),
    [(None, "is not a file"), ("a.b  one\na.b  two\n", "line 2: check 'a.b' is listed twice")],
    ids=["missing", "duplicate"],
)
def test_bad_expected_failures_file_is_a_usage_error(
    run_suite: RunSuite, content: str | None, match: str
) -> None:
    files = {} if content is None else {"xfail.txt": content}
    run = run_suite(EXPECTED, "--expected-failures", "xfail.txt", files=files)
    assert run.ret == pytest.ExitCode.USAGE_ERROR
    assert match in run.result.stderr.str()
