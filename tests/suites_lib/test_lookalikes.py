"""What a policy of classes selects: every instance of the listed classes, a subclass's
instance too, and no module of another class that merely shares a listed class's name
(WRAP-1, FSDP2-1, AC-1: "each instance of those classes"). The oracles, the callables the
specs build and torch's own policies agree on it; the checks of those clauses draw and run
such models; the coverage table says which of those words a configuration met."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from torch import nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, _recursive_wrap

from harness.clauses import ClassWords
from harness.torch_compat import WrapPolicyBase
from suites.lib.controller.lookalikes import (
    AC_LOOKALIKES,
    AC_NESTED,
    FSDP2_LOOKALIKES,
    LOOKALIKE_MODEL,
    WRAP_LOOKALIKES,
)
from suites.lib.controller.scenarios import model_specs, scenarios
from suites.lib.controller.selection import selection_difference
from suites.lib.shared import lookalike
from suites.lib.shared.axes import class_words, scenario_axes
from suites.lib.shared.models import Block, BlockSpec, ModelSpec, ScaledBlock, build_model
from suites.lib.shared.specs import ACSpec, FSDPConfig, Scenario, WrapSpec

#: in LOOKALIKE_MODEL: blocks.0 a Block, blocks.1 a ScaledBlock, blocks.2 the other Block
INSTANCES = {"blocks.0", "blocks.1"}


class _Unit(nn.Module):
    """Stands in for the FSDP wrapper when replaying torch's own recursive wrap."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.wrapped_unit = module


def _torch_units(policy: object) -> set[str]:
    """The modules torch's own auto wrap makes units of (the root left out): a policy
    object's ``_run_policy``, or FSDP1's recursion for a callable."""
    model = build_model(LOOKALIKE_MODEL)
    if isinstance(policy, WrapPolicyBase):
        chosen = policy._run_policy(model, set(), {})
        return {n for n, m in model.named_modules() if n and m in chosen}
    _recursive_wrap(model, policy, _Unit, set(), set(), only_wrap_children=True)
    return {
        n.replace(".wrapped_unit", "") for n, m in model.named_modules() if isinstance(m, _Unit)
    }


def test_the_zoo_holds_a_subclass_and_a_same_named_class_of_another_module() -> None:
    model = build_model(LOOKALIKE_MODEL)
    kinds = [type(block) for block in model.blocks]
    assert kinds == [Block, ScaledBlock, lookalike.Block]
    assert issubclass(ScaledBlock, Block) and ScaledBlock is not Block
    assert lookalike.Block.__name__ == "Block" and not issubclass(lookalike.Block, Block)
    assert lookalike.Block.__module__ != Block.__module__
    with pytest.raises(ValueError, match=r"'Subclass' is not a zoo block.*'ForeignBlock'"):
        ModelSpec(blocks=(BlockSpec("Subclass"),))


@pytest.mark.parametrize(
    "kind", ["classes", "module_wrap_policy", "custom_policy", "callable", "module_fn"]
)
def test_every_wrap_kind_of_block_selects_its_instances_not_its_name(kind: str) -> None:
    wrap = WrapSpec(kind, ("Block",))
    assert wrap.expected_units(build_model(LOOKALIKE_MODEL)) == INSTANCES
    if kind != "module_fn":  # FSDP2's form has no FSDP1 recursion to replay
        policy = wrap.build()
        if kind == "classes":  # a set of classes is FSDP1's ModuleWrapPolicy
            policy = ModuleWrapPolicy(policy)
        assert _torch_units(policy) == INSTANCES  # torch's own policies agree


@pytest.mark.parametrize("kind", ["classes", "module_wrap_policy", "callable"])
def test_every_checkpointing_kind_of_block_selects_its_instances(kind: str) -> None:
    assert ACSpec(kind, ("Block",)).expected_wrapped(build_model(LOOKALIKE_MODEL)) == INSTANCES


def test_the_coverage_axes_say_which_words_a_policy_of_classes_met() -> None:
    assert class_words(LOOKALIKE_MODEL, ("Block",)) == ClassWords.ALL
    assert class_words(LOOKALIKE_MODEL, ("Scale",)) == (ClassWords.LISTED,)
    assert class_words(LOOKALIKE_MODEL, ("NestedBlock",)) == ()  # none in the model
    wrap_only = scenario_axes(WRAP_LOOKALIKES[0])
    assert wrap_only["wrap classes"] == ClassWords.ALL
    assert "checkpointing classes" not in wrap_only  # no checkpointing policy
    assert scenario_axes(AC_LOOKALIKES[1])["checkpointing classes"] == ClassWords.ALL
    assert scenario_axes(FSDP2_LOOKALIKES[1])["wrap classes"] == ClassWords.ALL
    picker = Scenario(2, LOOKALIKE_MODEL, FSDPConfig(wrap=WrapSpec("callable", ("Block",))))
    assert "wrap classes" not in scenario_axes(picker)  # a callable picks for itself


def test_of_nested_selected_modules_only_the_outermost_is_checkpointed() -> None:
    ac = AC_NESTED.strategy.ac
    assert ac.expected_wrapped(build_model(AC_NESTED.model)) == {"blocks.0", "blocks.1"}
    words = scenario_axes(AC_NESTED)["checkpointing classes"]
    assert words == (ClassWords.LISTED, ClassWords.NESTED)
    units = WrapSpec("classes", ac.classes).expected_units(build_model(AC_NESTED.model))
    assert {"blocks.0.inner.0", "blocks.0.inner.1"} < units  # FSDP units may nest
    wrap_words = class_words(AC_NESTED.model, ac.classes)
    assert ClassWords.NESTED in wrap_words  # ... and scenario_axes leaves it off the wrap axis
    nested_wrap = Scenario(2, AC_NESTED.model, FSDPConfig(wrap=WrapSpec("classes", ac.classes)))
    assert scenario_axes(nested_wrap)["wrap classes"] == (ClassWords.LISTED,)


def test_every_example_lists_block_in_the_model_that_holds_all_three() -> None:
    for scenario in (*WRAP_LOOKALIKES, *FSDP2_LOOKALIKES, *AC_LOOKALIKES):  # AC_NESTED aside
        assert scenario.model == LOOKALIKE_MODEL and scenario.world_size == 2
        assert ClassWords.SAME_NAME in sum(scenario_axes(scenario).values(), ())
    assert {s.family for s in (*WRAP_LOOKALIKES, *AC_LOOKALIKES)} == {"fsdp", "fsdp2"}


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(model_specs(lookalikes=True), model_specs())
def test_models_hold_the_lookalikes_only_when_asked(asked: ModelSpec, plain: ModelSpec) -> None:
    assert [b.kind for b in asked.blocks][-2:] == ["ScaledBlock", "ForeignBlock"]
    assert not {"ScaledBlock", "ForeignBlock"} & {b.kind for b in plain.blocks}


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenarios("fsdp", wrap_kinds=("classes",), lookalikes=True))
def test_a_drawn_policy_of_classes_may_list_block_beside_the_lookalikes(s: Scenario) -> None:
    assert isinstance(s.strategy, FSDPConfig)
    assert set(s.strategy.wrap.classes) <= {"Block", "NestedBlock", "AttentionBlock", "Scale"}
    units = s.strategy.wrap.expected_units(build_model(s.model, "meta"))
    foreign = [f"blocks.{i}" for i, b in enumerate(s.model.blocks) if b.kind == "ForeignBlock"]
    assert foreign and not units & set(foreign)  # never selected, whatever is listed


def test_a_difference_names_each_module_missing_or_extra_with_its_class() -> None:
    model = build_model(LOOKALIKE_MODEL, "meta")
    said = selection_difference(model, ["", "blocks.0", "blocks.2"], ["", "blocks.0", "blocks.1"])
    assert said == (
        "missing blocks.1 (suites.lib.shared.models.ScaledBlock); "
        "extra blocks.2 (suites.lib.shared.lookalike.Block)"
    )
    assert selection_difference(model, ["blocks.0"], ["blocks.0"]) == ""
    assert "nowhere (not in the model)" in selection_difference(model, ["nowhere"], [])
