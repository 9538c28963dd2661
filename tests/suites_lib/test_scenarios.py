"""Hypothesis strategies draw only valid, picklable, readable scenarios."""

from __future__ import annotations

import dataclasses
import pickle

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suites.lib.controller.scenarios import max_world_size, plain_blocks, scenarios, with_scale
from suites.lib.shared.models import BlockSpec, ModelSpec, build_model
from suites.lib.shared.specs import FSDPConfig, MPConfig, Scenario

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
FAMILIES = st.sampled_from(["fsdp", "model_parallel"])
ANY = FAMILIES.flatmap(
    lambda f: scenarios(
        f,
        precisions=("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true"),
        ac=True,
        empty_init=None,
    )
)


@SETTINGS
@given(ANY)
def test_drawn_scenarios_are_valid(scenario: Scenario) -> None:
    assert 2 <= scenario.world_size <= max_world_size()
    assert pickle.loads(pickle.dumps(scenario)) == scenario
    assert "object at 0x" not in repr(scenario)
    config = scenario.strategy
    model = build_model(scenario.model, "meta")
    if isinstance(config, FSDPConfig):
        if "HYBRID" in config.sharding_strategy:
            assert config.device_mesh is not None
            assert config.device_mesh[0] * config.device_mesh[1] == scenario.world_size
        if scenario.model.tied:
            assert not config.wrap.expected_units(model) & {"embed", "head"}
        wrapped = sorted(config.ac.expected_wrapped(model))
        assert not any(b.startswith(a + ".") for a in wrapped for b in wrapped)
    else:
        assert isinstance(config, MPConfig)
        assert config.data_parallel_size * config.tensor_parallel_size == scenario.world_size
        assert all(b.ffn % config.tensor_parallel_size == 0 for b in scenario.model.blocks)
    if scenario.precision.startswith("16") and scenario.optim.kind != "sgd":
        assert scenario.optim.eps >= 1e-4
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable
    for block in scenario.model.blocks:  # a LayerNorm over 1 or 2 features passes back noise
        if block.kind == "AttentionBlock" and block.tokens > 1:
            assert scenario.model.hidden // block.tokens >= 3, block


@SETTINGS
@given(scenarios("fsdp", world_size=3, tied=True, frozen=True, nested=True))
def test_forced_features(scenario: Scenario) -> None:
    assert scenario.world_size == 3 and scenario.model.tied and scenario.model.frozen
    assert any(b.kind == "NestedBlock" for b in scenario.model.blocks)


def test_removing_the_scale_keeps_a_parameter_to_train() -> None:
    # nightly's draw (CKPT-STRICT-1): every parameter frozen but the Scale's gate, so the
    # model without its Scale had nothing to train and backward raised on every rank
    only_gate = ModelSpec(
        hidden=3,
        blocks=(BlockSpec(kind="Block", ffn=2, norm=False),),
        vocab=3,
        in_features=2,
        out=3,
        tied=True,
        scale=True,
        frozen=(
            "blocks.0.fc1.bias",
            "blocks.0.fc1.weight",
            "blocks.0.fc2.bias",
            "blocks.0.fc2.weight",
            "embed.weight",
            "head.bias",
        ),
    )
    without = with_scale(only_gate, False)
    assert not without.scale and without.frozen == ()
    assert any(p.requires_grad for p in build_model(without, "meta").parameters())
    assert with_scale(only_gate, True) == only_gate


def test_removing_the_scale_keeps_other_frozen_parameters_and_drops_the_gate() -> None:
    spec = ModelSpec(
        hidden=3,
        blocks=(BlockSpec(kind="Block", ffn=2),),
        in_features=2,
        out=2,
        scale=True,
        frozen=("blocks.0.fc1.weight", "scale.gate"),
    )
    assert with_scale(spec, False).frozen == ("blocks.0.fc1.weight",)


def test_plain_blocks_keep_a_parameter_to_train() -> None:
    # the trainer-layout checks turn every block into a plain Block: where only the attention
    # was trainable, the plain model would have nothing to train
    attention = ModelSpec(
        hidden=6,
        blocks=(BlockSpec(kind="AttentionBlock", ffn=2, norm=False, tokens=3),),
        in_features=2,
        out=2,
    )
    names = [n for n, _ in build_model(attention, "meta").named_parameters()]
    only_attention = dataclasses.replace(
        attention, frozen=tuple(n for n in names if ".attn." not in n)
    )
    plain = plain_blocks(only_attention)
    assert [b.kind for b in plain.blocks] == ["Block"]
    assert plain.frozen == ()
    some = dataclasses.replace(attention, frozen=("blocks.0.attn.wq.weight", "head.bias"))
    assert plain_blocks(some).frozen == ("head.bias",)
