"""CUDA-only checks: CPU offload of parameters, CUDA mixed precision, the rank's CUDA device.

They need one GPU per rank and the NCCL backend. The module-scoped ``cuda_world`` fixture
decides that in the controller (:mod:`suites.cuda_env`) and skips with an ``environment:``
reason before any job starts; on a machine that has them, scenarios draw world sizes up to
the largest one with a GPU per rank. (``16-mixed`` with the sharded grad scaler on CPU ranks
is checked in ``test_precision.py``.)

Clauses: CFG-6 and TRAIN-1 (parameter offload trains like the plain model, parameters and
optimizer state stay on the CPU between steps, compute runs on the GPU), PREC-2 and TRAIN-1
(mixed precision computes in the low dtype on the GPU, keeps float32 masters, matches the
plain model; the sharded grad scaler skips a step on every rank), API-6 (the root device is
the rank's CUDA device).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from harness import run_on_ranks
from suites._contract import SPEC, build
from suites._run import RankResult, micro_step, run, setup, train
from suites.cuda_env import cuda_world_max, session_cuda_skip_reason
from suites.models import Linear, build_model
from suites.oracles import assert_close_state, assert_parity, assert_same_on_ranks, gathered_state
from suites.scenarios import scenarios, train_plans
from suites.specs import MPConfig, Scenario
from suites.tolerances import EXACT

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
    """A world size from 2 to the largest one with a GPU per rank (read at draw time)."""
    return draw(st.integers(2, cuda_world_max()))


def with_precision(scenario: Scenario, precision: str) -> Scenario:
    """``scenario`` under ``precision``, with the loss scale and Adam eps it needs."""
    plan = dataclasses.replace(
        scenario.plan, loss_scale=1 / 256 if precision == "16-mixed" else 1.0
    )
    optim = dataclasses.replace(scenario.optim, eps=1e-4 if precision.startswith("16") else 1e-6)
    strategy = dataclasses.replace(scenario.strategy, precision=precision)
    return dataclasses.replace(scenario, strategy=strategy, plan=plan, optim=optim)


def pure_fsdp2(scenario: Scenario) -> Scenario:
    """A model_parallel scenario on a ``(world, 1)`` mesh: FSDP2 only, no tensor parallelism."""
    assert isinstance(scenario.strategy, MPConfig)
    strategy = dataclasses.replace(
        scenario.strategy,
        data_parallel_size=scenario.world_size,
        tensor_parallel_size=1,
        tp_plan="none",
    )
    return dataclasses.replace(scenario, strategy=strategy)


# --- rank side --------------------------------------------------------------------------


def offload_parallelize(
    module: nn.Module,
    device_mesh: Any,
    *,
    fsdp_classes: tuple[str, ...],
    reshard_after_forward: bool,
    precision: str,
) -> nn.Module:
    """A ``parallelize_fn`` that applies FSDP2 with ``CPUOffloadPolicy`` (no tensor parallel).

    Args:
        module: the zoo model.
        device_mesh: the strategy's mesh; ``data_parallel`` spans the world.
        fsdp_classes: zoo classes that become their own FSDP2 unit before the root.
        reshard_after_forward: ``fully_shard``'s option.
        precision: a mixed precision applies the matching ``MixedPrecisionPolicy``.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    low = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    kwargs = {
        "mesh": device_mesh["data_parallel"],
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low),
        "offload_policy": CPUOffloadPolicy(),
    }
    units = [m for m in module.modules() if type(m).__name__ in fsdp_classes and m is not module]
    for sub in reversed(units):  # inner units first
        fully_shard(sub, **kwargs)
    fully_shard(module, **kwargs)
    return module


def _offload_options(scenario: Scenario, form: str) -> dict[str, Any]:
    """Strategy options that offload parameters: ``cpu_offload`` (fsdp) or an offloading
    ``parallelize_fn`` (model_parallel)."""
    if isinstance(scenario.strategy, MPConfig):
        config = scenario.strategy
        return {
            "parallelize_fn": functools.partial(
                offload_parallelize,
                fsdp_classes=config.fsdp_classes,
                reshard_after_forward=config.reshard_after_forward,
                precision=config.precision,
            )
        }
    from torch.distributed.fsdp import CPUOffload

    return {"cpu_offload": True if form == "True" else CPUOffload(offload_params=True)}


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _placement(model: nn.Module) -> dict[str, list[str]]:
    """Sorted devices and dtypes of this rank's (local) parameters."""
    local = [_local(p) for p in model.parameters()]
    return {
        "devices": sorted({str(t.device) for t in local}),
        "dtypes": sorted({str(t.dtype) for t in local}),
    }


def _optim_devices(optimizer: torch.optim.Optimizer) -> list[str]:
    return sorted(
        {
            str(_local(v).device)
            for state in optimizer.state.values()
            for k, v in state.items()
            if k != "step" and isinstance(v, torch.Tensor) and v.is_floating_point()
        }
    )


def _expected_index(ctx: Any) -> int:
    """The rank's CUDA index: ``LOCAL_RANK`` under a launcher, else the rank (one node)."""
    return int(os.environ.get("LOCAL_RANK", ctx.rank))


def observed_train_rank(ctx: Any, scenario: Scenario, offload: str | None) -> RankResult:
    """Train ``scenario`` (offloading parameters when ``offload`` names a form) and record
    where parameters, optimizer state and a Linear's forward lived."""
    overrides = _offload_options(scenario, offload) if offload else {}
    t = setup(ctx, scenario, **overrides)
    compute: dict[str, str] = {}

    def record(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        weight = module.weight
        compute.setdefault("weight", f"{weight.dtype} on {weight.device}")
        compute.setdefault("output", f"{output.dtype} on {output.device}")

    linear = next(m for m in t.model.modules() if isinstance(m, Linear))
    handle = linear.register_forward_hook(record)
    result = RankResult(ctx.rank, t.strategy.distributed_sampler_kwargs["rank"])
    result.extra["before"] = _placement(t.model)
    train(t, scenario, result)
    handle.remove()
    result.extra["after"] = _placement(t.model)
    result.extra["optim"] = _optim_devices(t.optimizer)
    result.extra["compute"] = compute
    result.extra["cuda"] = f"cuda:{_expected_index(ctx)}"
    result.state = gathered_state(t.model)
    t.strategy.teardown()
    return result


def _skip_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    """One step with an inf in rank 0's gradient shard, then a finite one."""
    t = setup(ctx, scenario)
    dp_rank = t.strategy.distributed_sampler_kwargs["rank"]
    initial = gathered_state(t.model)
    micro_step(t, scenario, 0, 0, dp_rank)
    grads = [_local(p.grad) for p in t.model.parameters() if p.grad is not None]
    devices = sorted({str(g.device) for g in grads})
    if ctx.rank == 0:
        grad = next(g for g in grads if g.numel() > 0)
        grad.view(-1)[0] = float("inf")
    t.strategy.optimizer_step(t.optimizer)
    t.optimizer.zero_grad()
    skipped = gathered_state(t.model)
    micro_step(t, scenario, 1, 0, dp_rank)
    t.strategy.optimizer_step(t.optimizer)
    out = {
        "initial": initial,
        "skipped": skipped,
        "stepped": gathered_state(t.model),
        "grad_devices": devices,
        "cuda": f"cuda:{_expected_index(ctx)}",
    }
    t.strategy.teardown()
    return out


def device_rank(ctx: Any, family: str) -> dict[str, Any]:
    """Where the harness, the strategy and the set-up model put this rank."""
    import torch.distributed as dist

    strategy = build(ctx, family)
    model = strategy.setup_module(build_model(SPEC))
    reduced = strategy.all_reduce(torch.ones(2, device=ctx.device), reduce_op="sum")
    out = {
        "expected": f"cuda:{_expected_index(ctx)}",
        "spec_device": str(ctx.device),
        "backend": dist.get_backend(),
        "root_device": str(strategy.root_device),
        "current_device": f"cuda:{torch.cuda.current_device()}",
        "params": _placement(model)["devices"],
        "all_reduce": (str(reduced.device), reduced.tolist()),
    }
    strategy.teardown()
    return out


# --- controller side --------------------------------------------------------------------


FAMILY_SCENARIOS = {
    "fsdp": lambda world, precisions, plan: scenarios(
        "fsdp", world_size=world, sharding=SHARDINGS, precisions=precisions, plan=plan
    ),
    "model_parallel": lambda world, precisions, plan: scenarios(
        "model_parallel", world_size=world, plan=plan
    ),
}


def _drawn(family: str, precisions: tuple[str, ...], plan: Any) -> st.SearchStrategy[Scenario]:
    """Scenarios of ``family`` at a CUDA world size, under one of ``precisions``."""
    base = cuda_worlds().flatmap(lambda w: FAMILY_SCENARIOS[family](w, precisions, plan))
    return st.tuples(base, st.sampled_from(precisions)).map(
        lambda pair: with_precision(*pair) if family == "model_parallel" else pair[0]
    )


@pytest.mark.clause("CFG-6", "TRAIN-1")
@given(
    scenario=_drawn(
        "fsdp",
        ("32-true", "bf16-mixed", "16-mixed"),
        train_plans(max_micro=2, clip=None),
    ),
    form=st.sampled_from(("True", "CPUOffload")),
)
def test_fsdp_cpu_offload_keeps_parameters_on_cpu_and_trains_like_the_plain_model(
    cuda_world: int, scenario: Scenario, form: str
) -> None:
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
            f"{where}: a Linear's forward ran with {compute}; compute must run on "
            f"{r.extra['cuda']}"
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
        lambda family: _drawn(family, ("16-mixed",), train_plans())
    )
)
def test_cuda_sharded_grad_scaler_skips_the_step_on_every_rank(
    cuda_world: int, scenario: Scenario
) -> None:
    if scenario.model.frozen:
        scenario = dataclasses.replace(
            scenario, model=dataclasses.replace(scenario.model, frozen=())
        )
    outs = run(_skip_rank, scenario, world_size=scenario.world_size)
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
@pytest.mark.parametrize("family", ["fsdp", "model_parallel"])
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
