"""``--junitxml`` test cases carry clause ids, outcomes and findings; ``report.json`` has the
run's facts and each finding's example (Hypothesis' failing example, or the check's call)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime

from harness.conformance.findings.examples import call_example, failing_example
from tests.conformance.test_outcomes import RunSuite

SUITE = """
import pytest
from hypothesis import example, given, settings, strategies as st
from harness import clause

fast = settings(max_examples=25, database=None, derandomize=True)

@pytest.mark.clause("TRAIN-3", "TRAIN-1")
@fast
@given(st.integers(0, 20))
def test_hypothesis(n):
    assert n < 7

@pytest.mark.clause("TRAIN-2")
@fast
@example(n=9)
@given(st.integers(0, 5))
def test_explicit(n):
    assert n < 7

@pytest.mark.clause("CLIP-1")
@fast
@given(st.data())
def test_draws(data):
    assert data.draw(st.integers(0, 20)) < 7

@pytest.mark.clause("CKPT-RT-3")
@pytest.mark.parametrize("ws", [2, 4], ids=["ws2", "ws4"])
def test_plain(ws):
    assert ws == 2, "CKPT-RT-3: <optimizer> & state lost"

@pytest.mark.clause("CKPT-RT-1")
def test_blocked():
    with clause("API-2"):
        raise RuntimeError("setup_module broke")

@pytest.mark.clause("API-1")
def test_ok():
    pass

def test_no_clause():
    pass

@pytest.mark.clause("API-3")
def test_fails_then_teardown_errors(request):
    request.addfinalizer(lambda: (_ for _ in ()).throw(OSError("teardown broke")))
    assert False, "API-3: bad"
"""


def _testcases(path: str) -> dict[str, dict[str, str]]:
    """``{testcase name: {property: value}}``, the last test case of a name winning (a test
    whose call and teardown both failed gets two)."""
    cases: dict[str, dict[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        cases.setdefault(case.get("name", ""), {}).update(props)
    return cases


def test_junitxml_carries_clauses_outcomes_and_findings(run_suite: RunSuite) -> None:
    run = run_suite(SUITE, "--junitxml", "junit.xml")
    assert run.ret == 1
    cases = _testcases(str(run.report_dir.parent / "junit.xml"))
    report = run.report()
    finding = {c["id"]: c["finding"] for c in report["checks"]}
    assert cases["test_ok"] == {
        "check": "test_fake.test_ok",
        "clauses": "API-1",
        "outcome": "passed",
    }
    assert cases["test_no_clause"] == {"check": "test_fake.test_no_clause", "outcome": "passed"}
    hyp = cases["test_hypothesis"]
    assert hyp["clauses"] == "TRAIN-1,TRAIN-3" and hyp["outcome"] == "failed"
    assert hyp["finding"] == finding["test_fake.test_hypothesis"] and hyp["finding"].startswith("F")
    blocked = cases["test_blocked"]
    assert blocked["outcome"] == "blocked" and blocked["attributed_to"] == "API-2"
    assert blocked["finding"] == finding["test_fake.test_blocked"]
    assert cases["test_plain[ws2]"]["outcome"] == "passed"
    assert "finding" not in cases["test_plain[ws2]"]
    assert cases["test_plain[ws4]"]["finding"] == finding["test_fake.test_plain[ws4]"]
    # a failed call and a failed teardown: both of pytest's test cases carry the properties
    both = [
        {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in ET.parse(run.report_dir.parent / "junit.xml").getroot().iter("testcase")
        if case.get("name") == "test_fails_then_teardown_errors"
    ]
    assert len(both) == 2 and all(p["clauses"] == "API-3" and p.get("finding") for p in both)
    assert [p["outcome"] for p in both] == ["failed", "failed"]  # the worst phase wins


def test_report_json_has_run_facts_and_examples(run_suite: RunSuite) -> None:
    profile = (
        "from hypothesis import settings\n\nsettings.register_profile('mine', max_examples=25)\n"
    )
    files = {"test_fake.py": SUITE, "conftest.py": profile}
    run = run_suite(None, "--hypothesis-seed=42", "--hypothesis-profile=mine", files=files)
    report = run.report()
    facts = report["run"]
    assert facts["hypothesis_profile"] == "mine" and facts["hypothesis_seed"] == 42
    started = datetime.fromisoformat(facts["started_at"].replace("Z", "+00:00"))
    assert started.utcoffset() is not None and started.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert 0 < facts["wall_time_s"] < 300
    # what a published figure cites: the command as typed, shardcheck's commit, the machine
    assert facts["command"].startswith("pytest ") and "--hypothesis-seed=42" in facts["command"]
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", facts["commit"])
    assert facts["machine"]["cpus"] >= 1 and facts["machine"]["cpu"]
    examples = {f["checks"][0]: f["example"] for f in report["findings"]}
    assert examples["test_fake.test_hypothesis"] == (
        "Failing test case: test_hypothesis(\n    n=7,\n)"
    ) or examples["test_fake.test_hypothesis"].startswith("Falsifying example: test_hypothesis(")
    assert "explicit example: test_explicit(\n    n=9,\n)" in examples["test_fake.test_explicit"]
    assert examples["test_fake.test_draws"].endswith(")\nDraw 1: 7")
    assert examples["test_fake.test_plain[ws4]"] == "test_fake.test_plain[ws4] (ws=4)"
    assert examples["test_fake.test_blocked"] == "test_fake.test_blocked"


def test_report_json_seed_is_null_without_the_option(run_suite: RunSuite) -> None:
    run = run_suite("def test_ok():\n    pass\n")
    assert run.report()["run"]["hypothesis_seed"] is None


# -- the example extractor on its own ---------------------------------------------------------

PYTEST_TEXT = """\
E       assert 7 < 7
E       Falsifying example: test_x(
E           n=7,
E           name='a\\nb',
E       )
E       Draw 1: 7
E       Draw 2 (label): Plan(size=2,
E        steps=3)
E
E       You can reproduce this example by temporarily adding @reproduce_failure(...)
"""

STATEFUL = """\
E   AssertionError
E   Falsifying example:
E   state = Machine()
E   state.push(value=0)
E   state.teardown()
E
E   more
"""


def test_failing_example_reads_pytests_text() -> None:
    assert failing_example(PYTEST_TEXT) == (
        "Falsifying example: test_x(\n    n=7,\n    name='a\\nb',\n)\n"
        "Draw 1: 7\nDraw 2 (label): Plan(size=2,\n steps=3)"
    )
    assert failing_example(STATEFUL) == (
        "Falsifying example:\nstate = Machine()\nstate.push(value=0)\nstate.teardown()"
    )
    assert failing_example("Failing test case: test_y(n=1)\nother") == (
        "Failing test case: test_y(n=1)"
    )
    assert failing_example("AssertionError: no example here") == ""


def test_call_example_clips_long_values() -> None:
    assert call_example("t.test_a", {}) == "t.test_a"
    long = call_example("t.test_a[x]", {"x": "'" + "v" * 500 + "'"})
    assert long.startswith("t.test_a[x] (x='vvv") and long.endswith("...)") and len(long) < 200
