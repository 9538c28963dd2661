"""CONTRACT.md CKPT-REKEY-1, CKPT-REKEY-2, CKPT-TRAINER-1, CKPT-RT-6 and MP-3:
interoperation with plain torch, trainers and the other family.

- CKPT-REKEY-1: a checkpoint written by a plain torch model and optimizer (integer ids,
  groups in an order different from ``model.parameters()``) loads into the strategy, also
  in a trainer's layout.
- CKPT-REKEY-2: the strategy's full checkpoint loads into the plain model and optimizer
  with torch's own ``load_state_dict`` (the optimizer after the suite's own conversion of
  names to ids in ``param_groups`` order).
- CKPT-TRAINER-1: the trainer layout with two optimizers, written, read back by plain
  torch, loaded at another world size; a different optimizer count is refused.
- CKPT-RT-6: a full checkpoint written by one family loads into the other; MP-3 for the
  pairs that have the model_parallel family on one side. Each check is of the family that
  loads; where the strategy refuses the writing family, its reference strategy writes.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness.verdicts.checked_file import loading_checked_file
from suites.lib.controller.checkpoint_checks import (
    as_dtype,
    assert_loaded_equals_saved,
    assert_same_model,
    assert_same_optim,
    standard_form,
)
from suites.lib.controller.checkpoint_plans import ckpt_plans
from suites.lib.controller.clause_covers import (
    covering_examples,
    covering_rows,
    other_family_plan,
    round_trip_plan,
)
from suites.lib.controller.covering import CoverRow
from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import expected_dtypes, named_optim_state, plain_train
from suites.lib.controller.regressions import FULL_1X2_TO_2X2
from suites.lib.controller.scenarios import examples, plain_blocks
from suites.lib.controller.written import check_written
from suites.lib.ranks.checkpoint_interop_jobs import (
    load_plain_rank,
    trainer_load_rank,
    trainer_save_rank,
)
from suites.lib.ranks.checkpoint_jobs import (
    load_rank,
    path_for,
    save_rank,
    save_rank_or_reference,
)
from suites.lib.ranks.session_jobs import setup_probe_rank
from suites.lib.shared.checkpoint_specs import CkptPlan, ReorderedOptim
from suites.lib.shared.models import build_model, clean_name
from suites.lib.shared.specs import FSDPConfig, Scenario, WrapSpec

#: MP-3 ("every checkpoint clause holds for both formats, DTensor parameters included") is
#: about the model_parallel family: a pair checks it only when model_parallel saves or loads
_MP3 = [pytest.mark.clause("MP-3")]
#: (the family that writes, the family that loads): the check is of the loading family (its
#: ``family`` parameter), and the writing family's reference strategy writes where the
#: strategy under test refuses that family, so each pair runs whenever the strategy offers
#: the loading family
CROSS = [
    pytest.param("fsdp", "model_parallel", id="fsdp_to_model_parallel", marks=_MP3),
    pytest.param("model_parallel", "fsdp", id="model_parallel_to_fsdp", marks=_MP3),
    pytest.param("fsdp2", "fsdp", id="fsdp2_to_fsdp"),
    pytest.param("model_parallel", "fsdp2", id="model_parallel_to_fsdp2", marks=_MP3),
]


def _multi_group(plan: CkptPlan) -> CkptPlan:
    """The plan with several groups per optimizer, in reversed order on both sides."""
    fields = {**dataclasses.asdict(plan.save.optim), "groups": "by_depth"}
    save = dataclasses.replace(plan.save, optim=ReorderedOptim(**fields))
    load_fields = {**fields, "lr": fields["lr"] * 2}
    load = dataclasses.replace(plan.load, optim=ReorderedOptim(**load_fields))
    return dataclasses.replace(plan, save=save, load=load)


@pytest.mark.clause("CKPT-REKEY-1")
@pytest.mark.parametrize("layout", ["plain", "trainer"])
@examples(2)
@given(data=st.data())
def test_plain_torch_checkpoint_loads_into_the_strategy(
    layout: str, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plan = data.draw(ckpt_plans(fmt="full", min_steps=1), label="plan")
    _check_plain_checkpoint_loads(plan, layout, tmp_path_factory)


@pytest.mark.clause("CKPT-REKEY-1")
@pytest.mark.parametrize(
    "row", covering_rows("CKPT-REKEY-1", formats=("full",)), ids=lambda row: row.id
)
def test_plain_torch_checkpoint_loads_into_the_strategy_across_the_space(
    row: CoverRow, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The plain layout on each configuration (the trainer's is the check above's too)."""
    _check_plain_checkpoint_loads(round_trip_plan(row), "plain", tmp_path_factory)


def _check_plain_checkpoint_loads(
    drawn: CkptPlan, layout: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plan = _multi_group(drawn)
    model = build_model(plan.save.model)
    optimizer = plan.save.optim.build(model.named_parameters())
    plain_train(plan.save, model, optimizer)
    path = path_for(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()), "full")
    if layout == "plain":
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    else:
        content = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()]}
        torch.save({**content, "epoch": 1}, path)
    # a *-true strategy holds its state in the low dtype: the load converts what it reads
    stored = expected_dtypes(plan.load.precision)["stored"]
    expected_model = as_dtype(model.state_dict(), stored)
    expected_optim = as_dtype(named_optim_state(model, optimizer), stored)
    loaded = run(load_plain_rank, plan, path, layout, world_size=plan.load.world_size)
    for rank, out in enumerate(loaded):
        where = f"rank {rank} of {plan.load.world_size}, a plain torch checkpoint ({layout})"
        assert_same_model(out["model"], expected_model, clause="CKPT-REKEY-1", where=where)
        assert_same_optim(out["optim"], expected_optim, clause="CKPT-REKEY-1", where=where)


def _full_round_trip(scenario: Scenario) -> CkptPlan:
    """A covering configuration saved and loaded at its own world size (drawn plans may
    reshard)."""
    return round_trip_plan(CoverRow(scenario, "full"))


@pytest.mark.clause("CKPT-REKEY-2")
@covering_examples("CKPT-REKEY-2", adapt=_full_round_trip, argname="plan", share=3)
@given(plan=ckpt_plans(fmt="full", min_steps=1))
def test_strategy_full_checkpoint_loads_into_plain_torch(
    plan: CkptPlan, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = path_for(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()), "full")
    saved = run(save_rank, plan, path, world_size=plan.save.world_size)[0]
    check_written(plan.save, "full", path, where=plan.saved_at)
    content = torch.load(path, weights_only=True)
    where = f"{plan.worlds}, read by plain torch"
    plain = build_model(plan.load.model)
    plain.load_state_dict(content["model"])  # strict: keys exactly as in the plain model
    # the plain model is float32: a *-true strategy's low-dtype values load converted
    saved = as_dtype(saved, torch.float32)
    assert_same_model(plain.state_dict(), saved["model"], clause="CKPT-REKEY-2", where=where)
    names = {id(p): clean_name(n) for n, p in plain.named_parameters()}
    optimizer = plan.load.optim.build(plain.named_parameters())
    order = [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]
    assert {n for g in order for n in g} >= set(content["optimizer"]["state"]), (
        f"CKPT-REKEY-2: {where}: the optimizer state is keyed by "
        f"{sorted(content['optimizer']['state'])}, not by the plain model's parameter names"
    )
    optimizer.load_state_dict(standard_form(content["optimizer"], order))
    assert_same_optim(
        named_optim_state(plain, optimizer), saved["optim"], clause="CKPT-REKEY-2", where=where
    )


# --- the trainer layout -------------------------------------------------------------------


def _unit_aligned(plan: CkptPlan) -> CkptPlan:
    """Under fsdp, every ``Block`` its own FSDP1 unit and no NestedBlock: each flat
    parameter then lies in one of the two optimizers (blocks / the rest), as torch's
    FSDP1 optimizer state needs (see CKPT-TRAINER-1's scope). FSDP2 shards each parameter
    on its own: a model_parallel plan stays as drawn."""
    if plan.save.family != "fsdp":
        return plan

    def align(scenario: Scenario) -> Scenario:
        model = plain_blocks(scenario.model)
        strategy = scenario.strategy
        if isinstance(strategy, FSDPConfig):
            strategy = dataclasses.replace(strategy, wrap=WrapSpec("classes", ("Block",)))
        return dataclasses.replace(scenario, model=model, strategy=strategy)

    return dataclasses.replace(plan, save=align(plan.save), load=align(plan.load))


def _aligned(scenario: Scenario) -> bool:
    """Configurations whose FSDP1 flat parameters each lie in one of the two optimizers:
    any model_parallel one; under fsdp, Block-only models whose policy makes each Block its
    own unit (by class, module list, custom policy or callable)."""
    strategy = scenario.strategy
    if not isinstance(strategy, FSDPConfig):
        return True
    return all(b.kind == "Block" for b in scenario.model.blocks) and (
        strategy.wrap.kind in ("classes", "module_wrap_policy", "custom_policy", "callable")
        and strategy.wrap.classes == ("Block",)
    )


@pytest.mark.clause("CKPT-TRAINER-1", "CKPT-REKEY-2")
@covering_examples("CKPT-TRAINER-1", keep=_aligned, adapt=_full_round_trip, argname="plan", share=2)
@given(plan=ckpt_plans(fmt="full", reshard=True, min_steps=1).map(_unit_aligned))
@example(plan=FULL_1X2_TO_2X2)
def test_trainer_layout_with_two_optimizers(
    plan: CkptPlan, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = os.path.join(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()), "trainer.ckpt")
    saved = run(trainer_save_rank, plan, path, world_size=plan.save.world_size)[0]
    content = torch.load(path, weights_only=True)
    where = f"the trainer file ({plan.worlds})"
    assert {"state_dict", "optimizer_states", "epoch", "global_step"} <= set(content), (
        f"CKPT-TRAINER-1: {where} holds {sorted(content)}"
    )
    assert isinstance(content["optimizer_states"], list) and len(content["optimizer_states"]) == 2
    plain = build_model(plan.save.model)
    plain.load_state_dict(content["state_dict"])
    plain_saved = as_dtype(saved, torch.float32)  # a *-true strategy's state loads converted
    plain_optims = _plain_two_optimizers(plain, plan.save)
    for index, (opt, osd) in enumerate(zip(plain_optims, content["optimizer_states"], strict=True)):
        refs = [p for g in osd["param_groups"] for p in g["params"]]
        assert refs == list(range(len(refs))), (
            f"CKPT-TRAINER-1: {where}: optimizer {index} is not in the standard form (ids "
            f"0..n-1 in param_groups order): {refs}"
        )
        opt.load_state_dict(osd)  # torch's own: ids matched by position in param_groups
        assert_same_optim(
            named_optim_state(plain, opt),
            plain_saved["optims"][index],
            clause="CKPT-TRAINER-1",
            where=f"{where}, optimizer {index} loaded by plain torch",
        )
    loaded = run(trainer_load_rank, plan, path, world_size=plan.load.world_size)
    for rank, out in enumerate(loaded):
        where = f"load rank {rank}, {plan.worlds}, trainer layout"
        assert_same_model(out["model"], saved["model"], clause="CKPT-TRAINER-1", where=where)
        for index in range(2):
            assert_same_optim(
                out["optims"][index],
                saved["optims"][index],
                clause="CKPT-TRAINER-1",
                where=f"{where}, optimizer {index}",
            )
        assert out["epoch"] == 2, f"CKPT-LOAD-2: {where}: epoch is {out['epoch']!r}"
        assert out["refused"] is not None and "2" in out["refused"] and "1" in out["refused"], (
            f"CKPT-TRAINER-1: {where}: loading 2 optimizer states into 1 optimizer must raise "
            f"RuntimeError naming both counts; got {out['refused']!r}"
        )
        assert out["unchanged"], f"CKPT-TRAINER-1: {where}: the refused load changed the file"


def _plain_two_optimizers(plain: Any, scenario: Scenario) -> list[Any]:
    named = list(plain.named_parameters())
    trunk = [(n, p) for n, p in named if n.startswith("blocks.")]
    rest = [(n, p) for n, p in named if not n.startswith("blocks.")]
    half = dataclasses.replace(scenario.optim, lr=scenario.optim.lr / 2)
    return [scenario.optim.build(trunk), half.build(rest)]


# --- across families ----------------------------------------------------------------------


@pytest.mark.clause("CKPT-RT-6")
@pytest.mark.parametrize("source,family", CROSS)
@examples(2)
@given(data=st.data())
def test_full_checkpoint_loads_into_the_other_family(
    source: str, family: str, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plan = data.draw(ckpt_plans(source, "full", load_family=family, reshard=True), label="plan")
    _check_other_family(plan, tmp_path_factory)


def _rows_by_loading_family() -> list[Any]:
    """The covering rows of CKPT-RT-6, each with the family its plan loads into as the
    check's ``family``: the check is of that family (the other one may be written by its
    reference strategy)."""
    rows = covering_rows("CKPT-RT-6", formats=("full",))
    return [pytest.param(row, other_family_plan(row).load.family, id=row.id) for row in rows]


@pytest.mark.clause("CKPT-RT-6")
@pytest.mark.parametrize("row,family", _rows_by_loading_family())
def test_full_checkpoint_loads_into_the_other_family_across_the_space(
    row: CoverRow, family: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each covering configuration's full checkpoint, loaded into the other family."""
    _check_other_family(other_family_plan(row), tmp_path_factory)


def _check_other_family(plan: CkptPlan, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Save ``plan.save`` in the full format (by the strategy under test, or by the reference
    strategy of its family where the strategy refuses that family: a one-family strategy
    still loads the other families' checkpoints), load it into ``plan.load`` and compare."""
    # the loading family first: a strategy that refuses it is refused before anything is
    # written (the check is that family's; a remembered refusal then costs no rank job)
    run(setup_probe_rank, plan.load, "full", world_size=plan.load.world_size)
    path = path_for(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()), "full")
    saved = run(
        save_rank_or_reference,
        plan,
        path,
        world_size=plan.save.world_size,
        by_reference=plan.save,
    )
    found = ""
    if saved[0]["writer"] == "strategy":  # the strategy's own file, judged before it loads
        found = check_written(plan.save, "full", path, where=plan.saved_at)
    # the load builds plan.load alone: a refusal of the writing family is none of its business
    with loading_checked_file(found):
        loaded = run(load_rank, plan, path, world_size=plan.load.world_size, by_reference=plan.save)
    writer = "" if saved[0]["writer"] == "strategy" else ", written by the reference strategy"
    assert_loaded_equals_saved(plan, saved, loaded, clause="CKPT-RT-6", what=writer)
