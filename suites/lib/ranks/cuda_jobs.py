"""Rank side of the CUDA-only checks (``test_cuda.py``): train and observe where things live.

The functions run on the ranks (``run_on_ranks``) and report devices and dtypes as strings,
so the controller can compare them with the rank's CUDA device (``cuda:LOCAL_RANK``, or
``cuda:<rank>`` in the harness's one-node pool). The sharded grad scaler's skipped step
(PREC-2) is :func:`suites.lib.ranks.precision_jobs.skip_rank`, the job the CPU check runs too.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
from torch import nn

from suites.lib.ranks.construction import SPEC, build
from suites.lib.ranks.readers import gathered_state, local
from suites.lib.ranks.training import RankResult, end, setup, train
from suites.lib.shared.models import Linear, build_model
from suites.lib.shared.specs import FSDP2Config, MPConfig, Scenario

__all__ = ["device_rank", "expected_index", "observed_train_rank", "offload_parallelize"]


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
    """Strategy options that offload parameters: ``cpu_offload`` (fsdp: ``True`` or a
    ``CPUOffload``; fsdp2: ``True`` or a ``CPUOffloadPolicy``, ``form`` says which) or an
    offloading ``parallelize_fn`` (model_parallel)."""
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
    from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy

    if form == "True":
        return {"cpu_offload": True}
    if isinstance(scenario.strategy, FSDP2Config):
        return {"cpu_offload": CPUOffloadPolicy()}
    return {"cpu_offload": CPUOffload(offload_params=True)}


def _placement(model: nn.Module) -> dict[str, list[str]]:
    """Sorted devices and dtypes of this rank's (local) parameters."""
    shards = [local(p) for p in model.parameters()]
    return {
        "devices": sorted({str(t.device) for t in shards}),
        "dtypes": sorted({str(t.dtype) for t in shards}),
    }


def _optim_devices(optimizer: torch.optim.Optimizer) -> list[str]:
    return sorted(
        {
            str(local(v).device)
            for state in optimizer.state.values()
            for k, v in state.items()
            if k != "step" and isinstance(v, torch.Tensor) and v.is_floating_point()
        }
    )


def expected_index(ctx: Any) -> int:
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
    # first among the forward hooks, before an FSDP2 unit's own post-forward reshard (see
    # suites.lib.ranks.training.compute_dtypes)
    handle = linear.register_forward_hook(record, prepend=True)
    result = RankResult(ctx.rank, t.strategy.distributed_sampler_kwargs["rank"])
    result.extra["before"] = _placement(t.model)
    train(t, scenario, result)
    handle.remove()
    result.extra["after"] = _placement(t.model)
    result.extra["optim"] = _optim_devices(t.optimizer)
    result.extra["compute"] = compute
    result.extra["cuda"] = f"cuda:{expected_index(ctx)}"
    result.state = gathered_state(t.model)
    end(t.strategy)
    return result


def device_rank(ctx: Any, family: str) -> dict[str, Any]:
    """Where the harness, the strategy and the set-up model put this rank."""
    import torch.distributed as dist

    strategy = build(ctx, family)
    model = strategy.setup_module(build_model(SPEC))
    reduced = strategy.all_reduce(torch.ones(2, device=ctx.device), reduce_op="sum")
    out = {
        "expected": f"cuda:{expected_index(ctx)}",
        "spec_device": str(ctx.device),
        "backend": dist.get_backend(),
        "root_device": str(strategy.root_device),
        "current_device": f"cuda:{torch.cuda.current_device()}",
        "params": _placement(model)["devices"],
        "all_reduce": (str(reduced.device), reduced.tolist()),
    }
    end(strategy)
    return out
