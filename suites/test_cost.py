"""CONTRACT.md MEM-1 to MEM-4 and COMM-1 to COMM-5: what sharding is for.

Each configuration of :data:`ROWS` (every family, its sharding layouts, world sizes 1 to 4,
mixed precision; the ``ci`` profile keeps to :data:`CORE`) and each one drawn by
:func:`cost_scenarios` runs one rank job (:func:`~suites.lib.ranks.cost_jobs.cost_rank`): a warm-up
step, then one step measured with torch's ``MemTracker`` and ``CommDebugMode``, and a save and
its load, full or (for the rows of :data:`SHARDED`) sharded. The nine checks
read the same measurement (kept for the session: one job per row, whichever check asks
first) and hold it to the bounds :mod:`suites.lib.controller.cost` computes from the plain
model and the configuration. The models are deep (eight blocks) and narrow-batched, so
parameters outweigh activations and a unit more or less in flight shows.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.plugin import PROFILE_EXAMPLES
from suites.lib.controller.cost import Law
from suites.lib.controller.cost_verdicts import (
    SHARDED_SAVES,
    assert_accumulation_collectives,
    assert_clip_collectives,
    assert_full_load,
    assert_full_save,
    assert_held_at_rest,
    assert_save_collectives,
    assert_sharded_collectives,
    assert_step_peak,
    assert_synchronized_collectives,
    measure,
)
from suites.lib.controller.scenarios import examples, meshes, world_sizes
from suites.lib.ranks.cost_jobs import cost_rank
from suites.lib.shared.cost_record import CostRecord
from suites.lib.shared.models import BlockSpec, ModelSpec
from suites.lib.shared.specs import (
    FSDP2Config,
    FSDPConfig,
    MPConfig,
    OptimSpec,
    Scenario,
    StrategyConfig,
    TrainPlan,
    WrapSpec,
)

MODEL = ModelSpec(
    hidden=32, blocks=tuple(BlockSpec(ffn=64) for _ in range(8)), in_features=32, out=8, scale=False
)
BLOCKS = WrapSpec("classes", classes=("Block",))
PLAN = TrainPlan(steps=2, micro_batches=2, batch_size=4, clip=1.0)
ADAM = OptimSpec(kind="adam", lr=0.01)


def _row(world: int, config: StrategyConfig) -> Scenario:
    return Scenario(world_size=world, model=MODEL, strategy=config, optim=ADAM, plan=PLAN)


def _fsdp(sharding: str, precision: str = "32-true", mesh: Any = None) -> FSDPConfig:
    return FSDPConfig(
        sharding_strategy=sharding, wrap=BLOCKS, precision=precision, device_mesh=mesh
    )


def _fsdp2(reshard: bool | int = True, precision: str = "32-true", mesh: Any = None) -> FSDP2Config:
    return FSDP2Config(
        wrap=BLOCKS, reshard_after_forward=reshard, precision=precision, device_mesh=mesh
    )


def _mp(dp: int, tp: int, precision: str = "32-true") -> MPConfig:
    plan = "mlp" if tp > 1 else "none"
    return MPConfig(
        data_parallel_size=dp, tensor_parallel_size=tp, tp_plan=plan, precision=precision
    )


#: the measured configurations of every profile: each family's main layout at world sizes 1, 2
#: and 4 (and 3, uneven shards, for fsdp2: the per-rank law's points), HSDP and dp x tp
CORE: tuple[Scenario, ...] = (
    *(_row(w, _fsdp("FULL_SHARD")) for w in (1, 2, 4)),
    *(_row(w, _fsdp2()) for w in (1, 2, 3, 4)),
    _row(4, _fsdp2(mesh=(2, 2))),
    *(_row(w, _mp(w, 1)) for w in (1, 2, 4)),
    _row(4, _mp(2, 2)),
)
#: more layouts, measured under the dev and nightly profiles (the ci run keeps to CORE and the
#: drawn configurations, which reach these layouts too)
MORE: tuple[Scenario, ...] = (
    _row(3, _fsdp("FULL_SHARD")),
    _row(4, _fsdp("SHARD_GRAD_OP")),
    _row(2, _fsdp("NO_SHARD")),
    _row(4, _fsdp("HYBRID_SHARD", mesh=(2, 2))),
    _row(2, _fsdp("FULL_SHARD", "bf16-mixed")),
    _row(4, _fsdp2(False)),
    _row(4, _fsdp2(2)),
    _row(2, _fsdp2(precision="bf16-mixed")),
    _row(3, _mp(3, 1)),
    _row(2, _mp(2, 1, "bf16-mixed")),
)
ROWS = CORE + (MORE if settings().max_examples > PROFILE_EXAMPLES["ci"] else ())
#: the configurations whose save and load are measured in the sharded format (COMM-5's rows;
#: the others save a full checkpoint, MEM-3's, MEM-4's and COMM-4's rows): one save and load
#: per configuration keeps the cost checks' share of the ci time down
SHARDED: frozenset[Scenario] = frozenset(
    {
        _row(2, _fsdp2()),
        _row(4, _fsdp2(mesh=(2, 2))),
        _row(2, _mp(2, 1)),
        _row(4, _mp(4, 1)),
        _row(4, _fsdp2(False)),
        _row(2, _fsdp2(precision="bf16-mixed")),
        _row(2, _mp(2, 1, "bf16-mixed")),
    }
)


def _format(scenario: Scenario) -> str:
    return "sharded" if scenario in SHARDED else "full"


def _measured(scenario: Scenario) -> tuple[list[CostRecord], list[Law]]:
    return measure(scenario, cost_rank, _format(scenario))


def _id(scenario: Scenario) -> str:
    config = scenario.strategy
    if isinstance(config, FSDPConfig):
        layout = config.sharding_strategy.lower() + (
            f"-{config.device_mesh}" if config.device_mesh else ""
        )
    elif isinstance(config, FSDP2Config):
        layout = f"raf-{config.reshard_after_forward}".lower()
        layout += f"-hsdp{config.device_mesh}" if config.device_mesh else ""
    else:
        assert isinstance(config, MPConfig)
        layout = f"dp{config.data_parallel_size}xtp{config.tensor_parallel_size}"
    return f"{scenario.family}-{layout}-{scenario.precision}-w{scenario.world_size}".replace(
        " ", ""
    )


def _rows(fmt: str | None = None) -> Any:
    """Every row, or those whose save and load are measured in format ``fmt``."""
    rows = [r for r in ROWS if fmt is None or _format(r) == fmt]
    return pytest.mark.parametrize("scenario", rows, ids=[_id(r) for r in rows])


@pytest.mark.clause("MEM-1")
@_rows()
def test_each_rank_holds_its_share_at_rest(scenario: Scenario) -> None:
    assert_held_at_rest(scenario, *_measured(scenario))


@pytest.mark.clause("MEM-2")
@_rows()
def test_a_step_peaks_within_its_share_and_what_is_in_flight(scenario: Scenario) -> None:
    assert_step_peak(scenario, *_measured(scenario))


@pytest.mark.clause("MEM-3")
@_rows("full")
def test_a_full_save_goes_through_rank_0(scenario: Scenario) -> None:
    assert_full_save(scenario, *_measured(scenario))


@pytest.mark.clause("MEM-4")
@_rows("full")
def test_a_full_load_holds_the_saved_state_once(scenario: Scenario) -> None:
    assert_full_load(scenario, *_measured(scenario))


@pytest.mark.clause("COMM-4")
@_rows("full")
def test_a_full_save_gathers_each_tensor_once(scenario: Scenario) -> None:
    assert_save_collectives(scenario, *_measured(scenario))


@pytest.mark.clause("COMM-5")
@_rows("sharded")
def test_a_sharded_save_and_load_move_no_state(scenario: Scenario) -> None:
    assert_sharded_collectives(scenario, *_measured(scenario))


@pytest.mark.clause("COMM-1")
@_rows()
def test_a_synchronized_micro_batch_issues_its_configurations_collectives(
    scenario: Scenario,
) -> None:
    assert_synchronized_collectives(scenario, *_measured(scenario))


@pytest.mark.clause("COMM-2")
@_rows()
def test_clipping_reduces_norms_not_gradients(scenario: Scenario) -> None:
    assert_clip_collectives(scenario, *_measured(scenario))


@pytest.mark.clause("COMM-3")
@_rows()
def test_no_backward_sync_moves_no_gradient(scenario: Scenario) -> None:
    assert_accumulation_collectives(scenario, *_measured(scenario))


@st.composite
def cost_scenarios(draw: st.DrawFn) -> tuple[Scenario, str]:
    """A configuration of any family, world size, precision, depth, width, batch,
    accumulation, clipping and optimizer, and the checkpoint format its save and load are
    measured in (the rows above are fixed; these are drawn)."""
    world = draw(world_sizes(min_size=1))
    family = draw(st.sampled_from(("fsdp", "fsdp2", "model_parallel")))
    config: StrategyConfig
    if family == "model_parallel":
        tp = draw(st.sampled_from([t for t in (1, 2) if world % t == 0]))
        config = _mp(world // tp, tp, draw(st.sampled_from(("32-true", "bf16-mixed"))))
    else:
        precision = draw(st.sampled_from(("32-true", "bf16-mixed", "bf16-true")))
        mesh = draw(st.none() | meshes(world))
        if family == "fsdp":
            hybrid = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
            flat = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
            sharding = draw(st.sampled_from(hybrid if mesh else flat))
            config = _fsdp(sharding, precision, mesh)
        else:
            shard = mesh[1] if mesh else world
            reshards: list[bool | int] = [
                True,
                False,
                *([2] if shard % 2 == 0 and shard > 2 else []),
            ]
            config = _fsdp2(draw(st.sampled_from(reshards)), precision, mesh)
    hidden = draw(st.sampled_from((16, 32, 48)))
    ffn = draw(st.sampled_from((32, 64)))
    model = ModelSpec(
        hidden=hidden,
        blocks=tuple(BlockSpec(ffn=ffn) for _ in range(draw(st.integers(4, 8)))),
        in_features=hidden,
        out=8,
        scale=False,
    )
    plan = TrainPlan(
        steps=2,
        micro_batches=draw(st.integers(1, 3)),
        batch_size=draw(st.sampled_from((2, 4))),
        clip=draw(st.sampled_from((None, 1.0))),
    )
    optim = draw(st.sampled_from((ADAM, OptimSpec(kind="sgd", lr=0.01))))
    scenario = Scenario(world_size=world, model=model, strategy=config, optim=optim, plan=plan)
    formats = ("full", "sharded") if family in SHARDED_SAVES else ("full",)
    return scenario, draw(st.sampled_from(formats))


@pytest.mark.clause(
    "MEM-1", "MEM-2", "MEM-3", "MEM-4", "COMM-1", "COMM-2", "COMM-3", "COMM-4", "COMM-5"
)
@examples(5)
@given(drawn=cost_scenarios())
def test_drawn_configurations_cost_what_they_promise(drawn: tuple[Scenario, str]) -> None:
    scenario, fmt = drawn
    records, laws = measure(scenario, cost_rank, fmt)
    assert_held_at_rest(scenario, records, laws)
    assert_step_peak(scenario, records, laws)
    if fmt == "full":
        assert_full_save(scenario, records, laws)
        assert_full_load(scenario, records, laws)
        assert_save_collectives(scenario, records, laws)
    else:
        assert_sharded_collectives(scenario, records, laws)
    assert_synchronized_collectives(scenario, records, laws)
    assert_clip_collectives(scenario, records, laws)
    assert_accumulation_collectives(scenario, records, laws)
