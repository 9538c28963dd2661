"""Scenario dataclasses: readable, picklable, and built into the right torch objects."""

from __future__ import annotations

import functools
import pickle

import pytest
import torch
from torch import nn
from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy, _recursive_wrap

from suites.lib.shared.models import Block, BlockSpec, ModelSpec, NestedBlock, build_model
from suites.lib.shared.specs import ACSpec, FSDPConfig, MPConfig, OptimSpec, Scenario, WrapSpec

SPEC = ModelSpec(
    hidden=4,
    blocks=(BlockSpec("Block", ffn=3), BlockSpec("NestedBlock", ffn=2, inner=2)),
    vocab=6,
    out=6,
    tied=True,
)


class _Unit(nn.Module):
    """Stands in for the FSDP wrapper when replaying torch's own recursive wrap."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.wrapped_unit = module


def _torch_units(model: nn.Module, policy: object) -> set[str]:
    _recursive_wrap(model, policy, _Unit, set(), set(), only_wrap_children=True)
    return {
        n.replace(".wrapped_unit", "") for n, m in model.named_modules() if isinstance(m, _Unit)
    }


@pytest.mark.parametrize("threshold", [1, 5, 20, 30, 60, 10_000])
@pytest.mark.parametrize("tied", [False, True])
def test_size_units_match_torch_recursive_wrap(threshold: int, tied: bool) -> None:
    spec = ModelSpec(**{**SPEC.__dict__, "tied": tied})
    wrap = WrapSpec("size", min_num_params=threshold)
    expected = _torch_units(build_model(spec), wrap.build())
    assert wrap.expected_units(build_model(spec)) == expected


def test_callable_units_match_torch_recursive_wrap() -> None:
    wrap = WrapSpec("callable", classes=("Block", "Scale"))
    assert wrap.expected_units(build_model(SPEC)) == _torch_units(build_model(SPEC), wrap.build())
    assert wrap.expected_units(build_model(SPEC)) == {
        "blocks.0",
        "blocks.1.inner.0",
        "blocks.1.inner.1",
        "scale",
    }


def test_policy_objects() -> None:
    assert WrapSpec().build() is None and ACSpec().build() is None
    assert WrapSpec("classes", ("Block", "NestedBlock")).build() == {Block, NestedBlock}
    assert isinstance(WrapSpec("module_wrap_policy", ("Block",)).build(), ModuleWrapPolicy)
    assert isinstance(WrapSpec("custom_policy", ("Block",)).build(), CustomPolicy)
    assert isinstance(ACSpec("callable", ("Block",)).build(), functools.partial)
    assert ACSpec("classes", ("NestedBlock",)).expected_wrapped(build_model(SPEC)) == {"blocks.1"}
    with pytest.raises(ValueError, match=r"WrapSpec\.kind='bogus'"):
        WrapSpec("bogus").build()


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("groups", ["one", "by_kind", "by_depth"])
def test_optimizer_groups(kind: str, groups: str) -> None:
    model = build_model(SPEC)
    opt = OptimSpec(kind, lr=0.1, groups=groups, weight_decay=0.1).build(model.named_parameters())
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    assert len(opt.param_groups) == (1 if groups == "one" else 2)
    assert opt.param_groups[-1]["lr"] == (0.1 if groups == "one" else 0.05)
    if kind == "adamw" and groups != "one":
        assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_scenario_is_picklable_and_readable() -> None:
    scenario = Scenario(
        world_size=4,
        model=SPEC,
        strategy=FSDPConfig("HYBRID_SHARD", WrapSpec("classes", ("Block",)), device_mesh=(2, 2)),
    )
    assert pickle.loads(pickle.dumps(scenario)) == scenario
    text = repr(scenario)
    assert "object at 0x" not in text and "WrapSpec(kind='classes'" in text
    options = scenario.options()
    assert options["auto_wrap_policy"] == {Block} and options["device_mesh"] == (2, 2)
    assert scenario.family == "fsdp" and scenario.dp_size == 4


def test_mp_scenario_options() -> None:
    scenario = Scenario(world_size=4, model=SPEC, strategy=MPConfig(2, 2, tp_plan="mlp"))
    options = scenario.options()
    assert scenario.family == "model_parallel" and scenario.dp_size == 2
    assert options["data_parallel_size"] == 2 and options["tensor_parallel_size"] == 2
    assert callable(options["parallelize_fn"])
    assert torch.float32 == torch.get_default_dtype()
