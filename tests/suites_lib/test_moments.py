"""The ``moment`` axis: when a job saves, as the coverage table reports it (no ranks).

The clauses that speak of every moment (CKPT-RT-1/2, TRAIN-4) name the axis in their scope
with the suites' values; a checkpoint plan and a session segment report the moments of their
saves through the dispatch; the session driver classifies each save of its live objects.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.clauses import CLAUSES
from harness.clauses.checkpoints import MOMENTS as CONTRACT_MOMENTS
from harness.conformance.output.coverage import in_scope
from suites.lib.controller.clause_covers import round_trip_plan
from suites.lib.controller.covering import CoverRow
from suites.lib.controller.dispatch import _axes_in
from suites.lib.controller.session_draws import covering_scenario
from suites.lib.controller.session_driver import (
    SHORT_MOMENTS,
    SessionDriver,
    short_session,
    trainable,
)
from suites.lib.shared.axes import AXES, MOMENTS, moment_pairs
from suites.lib.shared.checkpoint_specs import CkptPlan
from suites.lib.shared.session_ops import Save, Step


def test_the_contract_and_the_suites_name_the_same_moments() -> None:
    assert CONTRACT_MOMENTS == MOMENTS and "moment" in AXES
    for clause in ("CKPT-RT-1", "CKPT-RT-2", "TRAIN-4"):
        assert dict(CLAUSES[clause].scope)["moment"] == MOMENTS


def test_moment_pairs_sit_in_the_universe_as_the_coverage_orders_them() -> None:
    pairs = moment_pairs(("second save",), {"checkpoint": {"full"}, "precision": {"32-true"}})
    assert pairs == {
        ("checkpoint", "full", "moment", "second save"),
        ("moment", "second save", "precision", "32-true"),
    }
    # with the ordinary moment beside every value, a moment scope keeps the other values in
    universe = moment_pairs(MOMENTS[:1], {"checkpoint": {"full", "sharded"}, "family": {"fsdp"}})
    universe |= moment_pairs(MOMENTS[1:], {"checkpoint": {"full"}})
    universe.add(("checkpoint", "full", "family", "fsdp"))
    scoped = in_scope(universe, dict(CLAUSES["CKPT-RT-1"].scope))
    assert scoped["moment"] == set(MOMENTS) and scoped["family"] == {"fsdp"}
    assert scoped["checkpoint"] == {"full"}


def test_a_plan_reports_the_moments_its_check_gives_it() -> None:
    scenario = covering_scenario("fsdp", 2)
    plan = CkptPlan(scenario, "full", scenario, moments=("second save", "mid-accumulation"))
    entries = _axes_in((plan,))
    assert [e["moment"] for e in entries] == [("mid-accumulation", "second save")] * 2
    assert all(e["checkpoint"] == ("full",) for e in entries)
    # a plan of a check whose clauses do not speak of moments reports none
    row = CoverRow(covering_scenario("model_parallel", 2), "sharded")
    assert all("moment" not in e for e in _axes_in((round_trip_plan(row),)))


class _Driver(SessionDriver):
    """The driver without ranks: segments are kept, not run."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[Any] = []

    def _probe(self, scenario: Any, fmt: str) -> None:
        pass

    def _flush(self, *, probe: bool = False) -> None:
        if probe:
            self._moment()
        self.ran.append((list(self.segment.ops), list(self.segment.moments)))
        self.segment.ops, self.segment.moments, self.expected = [], [], []

    @staticmethod
    def path(root: str, name: str, fmt: str) -> str:
        return f"{root}/{name}.{fmt}"


def test_the_session_driver_names_the_moment_of_each_save() -> None:
    scenario = covering_scenario("fsdp", 2)
    driver = _Driver()
    try:
        driver.begin(scenario, "full", trainable(scenario)[-1], [])
        zero = driver.do_save()
        driver.do_train((1, None))
        driver.do_save()
        driver.do_save()  # no training since the last save: an ordinary one
        mid = driver.do_save_mid_step((2, None))
        driver.do_save()
        assert driver.segment.moments == [
            "before first step",
            "second save",
            "after a step",
            "mid-accumulation",
            "second save",
        ]
        step = next(op for op in driver.segment.ops if isinstance(op, Step) and op.save)
        assert step.save == driver.saved[mid].path and step.micro == 2
        assert not driver.saved[zero].snapshot[1]["state"]  # the twin had not stepped
        assert isinstance(driver.segment.ops[0], Save)
        with pytest.raises(ValueError, match="2 micro-batches"):
            driver.do_save_mid_step((1, None))
        driver.do_load_fresh(zero, scenario, "sharded", strict=True)  # fresh objects
        driver.do_save()  # the loaded optimizer never stepped
        driver.do_train((2, None))
        driver.finished = driver.started = 1
        driver.close()
        assert driver.ran[-1][1] == ["before first step", "second save"]  # then the probe
    finally:
        driver.close()


def test_a_short_session_saves_at_its_moments_and_a_quiet_one_reports_none() -> None:
    scenario = covering_scenario("model_parallel", 2)
    ran: list[Any] = []

    class Recording(_Driver):
        def _flush(self, *, probe: bool = False) -> None:
            super()._flush(probe=probe)
            ran.append(self.ran[-1])

    short_session(Recording, scenario, "full")
    assert [m for _, moments in ran for m in moments] == list(SHORT_MOMENTS)
    ran.clear()
    short_session(type("Quiet", (Recording,), {"note_moments": False}), scenario, "full")
    assert not [m for _, moments in ran for m in moments]
