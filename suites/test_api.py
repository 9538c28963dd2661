"""CONTRACT.md API-1..API-8: the strategy object, for both families.

The rank side is in ``suites/lib/ranks/api_probes.py``: one job per family runs every probe, each on
a strategy of its own built through ``ctx.make_strategy``. The tests here read the ranks'
observations (computed once per session) and assert on every rank's; a probe that raised
fails only its own test, with every rank's traceback.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from harness import max_world_size, run_on_ranks
from harness.verdicts.attribution import tag
from suites.lib.controller.dispatch import report
from suites.lib.controller.oracles import (
    assert_close,
    assert_close_state,
    assert_parity,
    reference_run,
    scenario_tolerance,
)
from suites.lib.controller.scenarios import job_world
from suites.lib.controller.tolerances import EXACT
from suites.lib.ranks.api_probes import (
    FAMILIES,
    LOSS_DOWN,
    MP_PRECISIONS,
    PRECISIONS,
    SPEC,
    probe_arguments,
    scenario_of,
    surface_rank,
)
from suites.lib.shared.models import build_model, iter_param_owners

family_param = pytest.mark.parametrize("family", FAMILIES)


def world_of(family: str) -> int:
    """The world size of ``family``'s job: fsdp and fsdp2 2;
    model_parallel dp=2 x tp=2 when the session allows 4 ranks, else dp=2 x tp=1. With
    ``--nproc 1`` both run at world size 1 (model_parallel on a 1x1 mesh)."""
    if family != "model_parallel":
        return job_world(2)  # 1 in a one-rank session (see smallest_world)
    top = max_world_size()
    return 4 if top >= 4 else min(top, 2)


_OBSERVED: dict[str, tuple[str, Any]] = {}


def _observed(family: str) -> list[dict[str, Any]]:
    """Every rank's observations for ``family``: one job per session, shared by the tests."""
    if family not in _OBSERVED:
        try:
            _OBSERVED[family] = (
                "ok",
                run_on_ranks(surface_rank, family, world_size=world_of(family)),
            )
        except Exception as exc:  # RankFailure or Unsupported: every test of the family sees it
            _OBSERVED[family] = ("raised", exc)
    kind, value = _OBSERVED[family]
    if kind == "raised":
        raise value
    return value  # type: ignore[no-any-return]


def _values(family: str, probe: str) -> list[Any]:
    """Each rank's value of ``probe``; fails with every rank's traceback if one raised. A
    probe that passes arguments of the contract's methods reports them for the running check
    (with the family), as a job dispatched on its own would."""
    records = [ranks[probe] for ranks in _observed(family)]
    passed = probe_arguments(probe, world_of(family))
    if passed and all(kind != "unsupported" for kind, _ in records):
        report({"family": (family,), **passed})
    for kind, value in records:
        if kind == "unsupported":
            raise value
    failed = [(r, value) for r, (kind, value) in enumerate(records) if kind != "ok"]
    if failed:
        # first line: the first rank's exception (so one cause reads alike in every probe);
        # tagged with the clause the rank attributed it to
        first_rank, (first_tb, clause) = failed[0]
        last = [line for line in first_tb.strip().splitlines() if line.strip()][-1]
        stories = "\n".join(f"rank {r}: {tb}" for r, (tb, _) in failed)
        error = pytest.fail.Exception(
            f"rank {first_rank}: {last}\n{family} {probe} raised on the ranks:\n{stories}",
            pytrace=False,
        )
        tag(error, clause)
        raise error
    return [value for _, value in records]


@pytest.mark.clause("API-1")
@family_param
def test_setup_environment_reuses_the_callers_process_group(family: str) -> None:
    world = world_of(family)
    for rank, seen in enumerate(_values(family, "api1")):
        assert seen == {
            "initialized": True,
            "same_group": True,
            "world_size": world,
            "sum": world * (world + 1) / 2,
        }, f"rank {rank}: after setup_environment() the caller's default group must be the same"


@pytest.mark.clause("API-2")
@family_param
def test_setup_module_shards_and_setup_optimizer_steps_it(family: str) -> None:
    results = [v["result"] for v in _values(family, "api2")]
    plain = build_model(SPEC)
    for r in results:
        extra = r.extra
        assert extra["is_module"] and extra["is_optimizer"], f"rank {r.rank}: {extra}"
        if world_of(family) > 1:  # at world size 1 the one shard is the whole model
            assert extra["local"] < extra["full"], (
                f"rank {r.rank}: the module setup_module returned holds {extra['local']} of "
                f"{extra['full']} parameter elements locally; a sharded module holds fewer"
            )
        with torch.no_grad():
            expected = plain(extra["input"])
        tol = scenario_tolerance(scenario_of(family, world_of(family)))
        assert_close(extra["output"], expected, tol, name=f"rank {r.rank}: forward output")
    assert_parity(results, scenario_of(family, world_of(family)))


@pytest.mark.clause("API-2")
def test_setup_module_and_optimizers_returns_the_pair() -> None:
    results = [v["result"] for v in _values("fsdp", "api2_joint")]
    for r in results:
        assert r.extra == {"shape": ("tuple", 2, "list", 1), "is_module": True}, (
            f"rank {r.rank}: setup_module_and_optimizers(module, [opt]) must return "
            f"(module, [optimizer]); got (type, len, type of [1], len of [1]) = {r.extra}"
        )
    assert_parity(results, scenario_of("fsdp", world_of("fsdp")))


@pytest.mark.clause("API-3")
@family_param
def test_module_init_context_meta_and_materialization(family: str) -> None:
    eager = {k: v.detach() for k, v in build_model(SPEC).state_dict().items()}
    owners = sorted(name for name, _ in iter_param_owners(build_model(SPEC, "meta")))
    for rank, seen in enumerate(_values(family, "api3")):
        assert seen["is_context_manager"], f"rank {rank}: module_init_context() is no context"
        for flag in (False, None):
            assert not seen[f"meta[{flag}]"], (
                f"rank {rank}: empty_init={flag} created meta tensors {seen[f'meta[{flag}]']}"
            )
            assert_close_state(seen[f"state[{flag}]"], eager, EXACT, what=f"rank {rank}: {flag}")
        assert not seen["real_under_empty_init"], (
            f"rank {rank}: empty_init=True created real tensors {seen['real_under_empty_init']}"
        )
        assert not seen["meta_after_setup"], (
            f"rank {rank}: setup_module left meta tensors {seen['meta_after_setup']}"
        )
        wrong = {n: c for n, c in seen["reset_calls"].items() if c != 1}
        assert sorted(seen["reset_calls"]) == owners and not wrong, (
            f"rank {rank}: reset_parameters() must run exactly once on every module that owns "
            f"parameters or buffers; these ran another number of times: {wrong}"
        )


@pytest.mark.clause("API-4")
@pytest.mark.parametrize(
    ("family", "precision"),
    [
        *(("fsdp", p) for p in PRECISIONS),
        *(("model_parallel", p) for p in MP_PRECISIONS),
        *(("fsdp2", p) for p in MP_PRECISIONS),
    ],
)
def test_backward_and_step_go_through_the_precision(family: str, precision: str) -> None:
    ref_scenario = scenario_of(family, world_of(family), precision)
    ref = reference_run(ref_scenario)
    tol = scenario_tolerance(ref_scenario)
    names = [k for k, g in ref.grads.items() if g is not None]
    for rank, seen in enumerate(_values(family, f"api4[{precision}]")):
        grads = seen["grads"]
        missing = [k for k in names if grads.get(k) is None]
        assert not missing, f"rank {rank}: no gradient after backward() for {missing}"
        dot = sum(float((grads[k].double() * ref.grads[k].double()).sum()) for k in names)
        norm = sum(float(ref.grads[k].double().pow(2).sum()) for k in names)
        scale = dot / norm / LOSS_DOWN
        if precision == "16-mixed":
            assert math.isfinite(scale) and scale > 1.5, (
                f"rank {rank}: under 16-mixed backward() must scale the loss (grad scaler); "
                f"the gradients are {scale:.4g} x the unscaled ones"
            )
        else:
            scale = 1.0
        for k in names:
            assert_close(
                grads[k] / (scale * LOSS_DOWN), ref.grads[k], tol, name=f"rank {rank}: grad {k}"
            )
        assert_close_state(seen["state"], ref.state, tol, what=f"rank {rank}: after step")


@pytest.mark.clause("API-5")
@family_param
def test_collectives(family: str) -> None:
    world = world_of(family)
    total = world * (world + 1) / 2
    objects = {
        src: {"rank": src, "list": [src] * 3, "tensor": [float(src)] * 2}
        for src in sorted({0, world - 1})
    }
    for rank, seen in enumerate(_values(family, "api5")):
        assert seen["sum"] == [total, 2 * total], f"rank {rank}: all_reduce sum {seen['sum']}"
        for key in ("mean", "default"):
            assert seen[key] == pytest.approx([total / world, 2 * total / world]), (
                f"rank {rank}: all_reduce ({key}) gave {seen[key]}; 'mean' is the default"
            )
        assert seen["int_sum"] == [total], f"rank {rank}: integer all_reduce {seen['int_sum']}"
        assert seen["non_tensor"] == [7, "x"], f"rank {rank}: {seen['non_tensor']}"
        assert seen["broadcast"] == objects, f"rank {rank}: broadcast gave {seen['broadcast']}"


@pytest.mark.clause("API-6")
@family_param
def test_root_device_and_sampler_kwargs(family: str) -> None:
    seen = _values(family, "api6")
    for rank, s in enumerate(seen):
        assert s["root_device"] == s["device"], f"rank {rank}: root_device {s['root_device']}"
        assert {k: s["kwargs"].get(k) for k in ("num_replicas", "rank")} == s["expected"], (
            f"rank {rank}: distributed_sampler_kwargs {s['kwargs']}, expected {s['expected']}"
        )
    replicas = seen[0]["expected"]["num_replicas"]
    ranks = sorted(s["expected"]["rank"] for s in seen)
    assert ranks == sorted(list(range(replicas)) * (len(seen) // replicas)), ranks


@pytest.mark.clause("API-7")
@family_param
def test_checkpoint_io_is_refused(family: str) -> None:
    assert _values(family, "api7") == ["refused"] * world_of(family)


@pytest.mark.clause("API-8")
@family_param
def test_teardown_keeps_the_callers_process_group(family: str) -> None:
    world = world_of(family)
    for rank, seen in enumerate(_values(family, "api8")):
        assert seen["initialized"] and seen["same_group"], f"rank {rank}: {seen}"
        assert seen["sum"] == world * (world + 1) / 2, f"rank {rank}: collective after teardown"
        assert seen["module_released"], (
            f"rank {rank}: the strategy still holds the module after teardown()"
        )
