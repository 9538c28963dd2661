"""The training-session check's draws (TRAIN-4): valid scenarios, every rule by construction."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suites.lib.controller.session_draws import PRECISIONS, covering_scenario, session_scenarios
from suites.lib.shared.models import build_model
from suites.lib.shared.specs import FSDPConfig, MPConfig, Scenario

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(st.sampled_from(["fsdp", "model_parallel"]).flatmap(session_scenarios))
def test_session_scenarios_hold_state_and_replicate_hybrid_meshes(scenario: Scenario) -> None:
    assert pickle.loads(pickle.dumps(scenario)) == scenario
    assert scenario.precision in PRECISIONS[scenario.family]
    if scenario.precision == "16-mixed":  # as the twin scales it: no overflow, no skipped step
        assert scenario.plan.loss_scale == 1 / 256
    if scenario.precision == "16-true":  # fp16 Adam's second moment underflows
        assert scenario.optim.kind == "sgd"
    assert scenario.optim.momentum == 0.9  # SGD has state too
    config = scenario.strategy
    if isinstance(config, FSDPConfig) and "HYBRID" in config.sharding_strategy:
        replicas, shards = config.device_mesh or (0, 0)
        assert replicas > 1 and replicas * shards == scenario.world_size


@pytest.mark.parametrize("family", ["fsdp", "model_parallel"])
@pytest.mark.parametrize("world", [4, 2])
def test_covering_scenarios_are_valid(family: str, world: int) -> None:
    scenario = covering_scenario(family, world)
    assert scenario.family == family and scenario.world_size == world
    model = build_model(scenario.model, "meta")
    assert scenario.model.tied and any(
        n.startswith("blocks.1") for n, _ in model.named_parameters()
    )
    config = scenario.strategy
    if isinstance(config, MPConfig):
        assert config.data_parallel_size * config.tensor_parallel_size == world
        assert all(b.ffn % config.tensor_parallel_size == 0 for b in scenario.model.blocks)
    elif config.device_mesh is not None:
        assert config.device_mesh[0] * config.device_mesh[1] == world
