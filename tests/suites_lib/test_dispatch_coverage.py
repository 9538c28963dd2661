"""The suites' dispatch reports the axis values of every job that reached the ranks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from harness.refusals import Refusal
from harness.run.session import current
from suites.lib.controller.dispatch import run
from suites.lib.controller.regressions import INIT_NESTED
from suites.lib.ranks.training import train_rank
from suites.lib.shared.arguments import plan_arguments
from suites.lib.shared.axes import scenario_axes


class _Recorder:
    def __init__(self) -> None:
        self.seen: list[dict[str, tuple[str, ...]]] = []
        self.ran = 0

    def before_job(self) -> None:
        pass

    def job_ran(self) -> None:
        self.ran += 1

    def refused(self, refusal: Refusal) -> None:
        raise AssertionError(f"not refused: {refusal}")

    def exercised(self, axes: Mapping[str, Sequence[str]]) -> None:
        self.seen.append({k: tuple(v) for k, v in axes.items()})


def test_a_job_that_ran_reports_its_scenarios_axes() -> None:
    recorder = _Recorder()
    with current().observing(recorder):
        results = run(train_rank, INIT_NESTED, world_size=INIT_NESTED.world_size)
    assert len(results) == INIT_NESTED.world_size
    assert recorder.ran == 1
    # with the arguments it passed: empty_init=True, enabled=False (one micro-batch)
    assert recorder.seen == [{**scenario_axes(INIT_NESTED), **plan_arguments(INIT_NESTED)}]
    assert recorder.seen[0]["empty_init"] == ("True",)
    axes = scenario_axes(INIT_NESTED, "sharded")
    assert axes["family"] == ("fsdp",) and axes["sharding"] == ("FULL_SHARD",)
    assert axes["world_size"] == ("2",) and axes["checkpoint"] == ("sharded",)
    assert axes["model"] == ("Block", "NestedBlock", "buffers", "tied embedding")
