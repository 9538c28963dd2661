"""CUDA-only checks: CPU offload of parameters, CUDA mixed precision, the rank's CUDA device.

They need one GPU per rank and the NCCL backend. The module-scoped ``cuda_world`` fixture
decides that in the controller (:mod:`suites.lib.controller.cuda_env`) and skips with an
``environment:`` reason before any job starts; on a machine that has them, scenarios draw
world sizes up to the largest one with a GPU per rank. (``16-mixed`` with the sharded grad
scaler on CPU ranks is checked in ``test_precision.py``.)

Clauses: CFG-6 and TRAIN-1 (parameter offload trains like the plain model, parameters and
optimizer state stay on the CPU between steps, compute runs on the GPU; for each family CFG-6
applies to), PREC-2 and TRAIN-1
(mixed precision computes in the low dtype on the GPU, keeps float32 masters, matches the
plain model; the sharded grad scaler skips a step on every rank), API-6 (the root device is
the rank's CUDA device).

[Note: one micro-batch for FSDP1 here] FSDP1 plans use one micro-batch per step: with
NO_SHARD, frozen parameters and a mixed precision, accumulating under ``no_backward_sync``
fails inside torch's FSDP1 on CPU already ("attempting to assign a gradient with dtype
BFloat16 to a tensor with grad_dtype Float"); that is a SYNC-1 matter, not a CUDA one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness import run_on_ranks
from harness.clauses import CLAUSES
from suites.lib.controller.cuda_env import MIN_WORLD, cuda_world_max, session_cuda_skip_reason
from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import assert_close_state, assert_parity, assert_same_on_ranks
from suites.lib.controller.scenarios import scenarios, train_plans
from suites.lib.controller.tolerances import EXACT
from suites.lib.ranks.cuda_jobs import device_rank, observed_train_rank
from suites.lib.ranks.precision_jobs import skip_rank
from suites.lib.ranks.training import RankResult
from suites.lib.shared.specs import MPConfig, Scenario

SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
LOW = {"bf16-mixed": "torch.bfloat16", "16-mixed": "torch.float16"}


@pytest.fixture(scope="module")
def cuda_world() -> int:
    """The largest world size with one GPU per rank and NCCL; skips (environment) if none."""
    reason = session_cuda_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return cuda_world_max()


@st.composite
def cuda_worlds(draw: st.DrawFn) -> int:
    """A world size from 1 to the largest one with a GPU per rank (read at draw time)."""
    return draw(st.integers(MIN_WORLD, cuda_world_max()))


def with_precision(scenario: Scenario, precision: str) -> Scenario:
    """``scenario`` under ``precision``, with the loss scale and Adam eps it needs."""
    plan = dataclasses.replace(
        scenario.plan, loss_scale=1 / 256 if precision == "16-mixed" else 1.0
    )
    optim = dataclasses.replace(scenario.optim, eps=1e-4)
    strategy = dataclasses.replace(scenario.strategy, precision=precision)
    return dataclasses.replace(scenario, strategy=strategy, plan=plan, optim=optim)


def pure_fsdp2(scenario: Scenario) -> Scenario:
    """A model_parallel scenario on a ``(world, 1)`` mesh: FSDP2 only, no tensor parallelism."""
    if not isinstance(scenario.strategy, MPConfig):
        raise TypeError(f"pure_fsdp2 needs a model_parallel scenario, got {scenario.family}")
    strategy = dataclasses.replace(
        scenario.strategy,
        data_parallel_size=scenario.world_size,
        tensor_parallel_size=1,
        tp_plan="none",
    )
    return dataclasses.replace(scenario, strategy=strategy)


# --- controller side --------------------------------------------------------------------


def _drawn(
    family: str, precisions: tuple[str, ...], plan: Any, **restrict: Any
) -> st.SearchStrategy[Scenario]:
    """Scenarios of ``family`` at a CUDA world size under one of ``precisions``
    (``restrict``: more keyword arguments of :func:`~suites.lib.controller.scenarios.scenarios`)."""
    worlds = cuda_worlds()
    if family == "fsdp":
        return worlds.flatmap(
            lambda w: scenarios(
                "fsdp",
                world_size=w,
                sharding=SHARDINGS,
                precisions=precisions,
                plan=plan,
                **restrict,
            )
        )
    # the model_parallel draw knows 32-true and bf16-mixed only: set the precision after it
    drawn = worlds.flatmap(lambda w: scenarios(family, world_size=w, plan=plan, **restrict))
    return st.tuples(drawn, st.sampled_from(precisions)).map(lambda pair: with_precision(*pair))


#: per family CFG-6 applies to: the precisions drawn, the plans, and the forms of
#: ``cpu_offload`` that offload (a bool, or the family's own object)
_OFFLOADED = {
    "fsdp": (
        ("32-true", "bf16-mixed", "16-mixed"),
        train_plans(clip=None),  # [Note: one micro-batch for FSDP1 here]
        ("True", "CPUOffload"),
    ),
    "fsdp2": (("32-true", "bf16-mixed"), train_plans(max_micro=2), ("True", "CPUOffloadPolicy")),
}


@pytest.mark.clause("CFG-6", "TRAIN-1")
@pytest.mark.parametrize("family", CLAUSES["CFG-6"].families)
@given(data=st.data())
def test_cpu_offload_keeps_parameters_on_cpu_and_trains_like_the_plain_model(
    cuda_world: int, family: str, data: st.DataObject
) -> None:
    precisions, plans, forms = _OFFLOADED[family]
    scenario = data.draw(_drawn(family, precisions, plans), label="scenario")
    form = data.draw(st.sampled_from(forms), label="form")
    results = run(observed_train_rank, scenario, form, world_size=scenario.world_size)
    _check_offloaded(results, scenario)
    assert_parity(results, scenario)


@pytest.mark.clause("TRAIN-1")
@given(
    scenario=_drawn("model_parallel", ("32-true", "bf16-mixed"), train_plans(max_micro=2)).map(
        pure_fsdp2
    )
)
def test_fsdp2_cpu_offload_policy_keeps_parameters_on_cpu_and_trains_like_the_plain_model(
    cuda_world: int, scenario: Scenario
) -> None:
    results = run(observed_train_rank, scenario, "policy", world_size=scenario.world_size)
    _check_offloaded(results, scenario)
    assert_parity(results, scenario)


def _check_offloaded(results: list[RankResult], scenario: Scenario) -> None:
    for r in results:
        where = f"rank {r.rank} ({scenario.family}, {scenario.precision}, parameter offload)"
        for when in ("before", "after"):
            assert r.extra[when]["devices"] == ["cpu"], (
                f"{where}: {when} training, sharded parameters live on "
                f"{r.extra[when]['devices']}; offloaded parameters stay on the CPU between steps"
            )
        assert r.extra["optim"] in ([], ["cpu"]), (
            f"{where}: optimizer state on {r.extra['optim']}; with parameter offload the "
            "optimizer steps on the CPU"
        )
        compute = r.extra["compute"]
        assert compute and all(v.endswith(f"on {r.extra['cuda']}") for v in compute.values()), (
            f"{where}: a Linear's forward ran with {compute}; compute must run on {r.extra['cuda']}"
        )


@pytest.mark.clause("PREC-2", "TRAIN-1")
@given(
    st.sampled_from(("fsdp", "model_parallel")).flatmap(
        lambda family: _drawn(family, ("bf16-mixed", "16-mixed"), train_plans(clip=None))
    )
)
def test_cuda_mixed_precision_computes_low_on_the_gpu_and_matches(
    cuda_world: int, scenario: Scenario
) -> None:
    results = run(observed_train_rank, scenario, None, world_size=scenario.world_size)
    low = LOW[scenario.precision]
    for r in results:
        where = f"rank {r.rank} ({scenario.family}, {scenario.precision})"
        cuda = r.extra["cuda"]
        assert r.extra["compute"].get("output") == f"{low} on {cuda}", (
            f"{where}: a Linear's forward gave {r.extra['compute']}; expected {low} on {cuda}"
        )
        for when in ("before", "after"):
            placed = r.extra[when]
            assert placed["devices"] == [cuda] and placed["dtypes"] == ["torch.float32"], (
                f"{where}: {when} training the sharded parameters are {placed}; float32 "
                f"masters on {cuda} expected"
            )
        assert r.extra["optim"] in ([], [cuda]), f"{where}: optimizer state on {r.extra['optim']}"
    assert_parity(results, scenario)


@pytest.mark.clause("PREC-2", "API-4")
@given(
    st.sampled_from(("fsdp", "model_parallel")).flatmap(
        lambda family: _drawn(family, ("16-mixed",), train_plans(), frozen=False)
    )
)
def test_cuda_sharded_grad_scaler_skips_the_step_on_every_rank(
    cuda_world: int, scenario: Scenario
) -> None:
    outs = run(skip_rank, scenario, world_size=scenario.world_size)
    for rank, out in enumerate(outs):
        assert out["grad_devices"] == [out["cuda"]], (
            f"rank {rank}: gradients on {out['grad_devices']}, expected {out['cuda']}"
        )
        assert_close_state(
            out["skipped"], out["initial"], EXACT, what=f"rank {rank}: after an inf on rank 0"
        )
        moved = [k for k in out["stepped"] if not torch.equal(out["stepped"][k], out["initial"][k])]
        assert moved, f"rank {rank}: the next, finite step changed no parameter"
    assert_same_on_ranks([out["stepped"] for out in outs], what="parameter after the next step")


@pytest.mark.clause("API-6")
@pytest.mark.parametrize("family", CLAUSES["API-6"].families)
def test_root_device_is_the_ranks_cuda_device(cuda_world: int, family: str) -> None:
    for rank, out in enumerate(run_on_ranks(device_rank, family, world_size=cuda_world)):
        cuda = out["expected"]
        seen = {k: out[k] for k in ("spec_device", "root_device", "current_device")}
        assert seen == dict.fromkeys(seen, cuda), (
            f"rank {rank} ({family}): StrategySpec.device, strategy.root_device and the "
            f"current CUDA device are {seen}; each must be {cuda}"
        )
        assert out["backend"] == "nccl", f"rank {rank}: process-group backend {out['backend']}"
        assert out["params"] == [cuda], f"rank {rank}: set-up parameters on {out['params']}"
        assert out["all_reduce"] == (cuda, [float(cuda_world)] * 2), (
            f"rank {rank}: all_reduce(ones(2), sum) on {cuda} gave {out['all_reduce']}"
        )
