"""The Lightning adapter: Fabric's own strategies, built for a harness rank, nothing hidden."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from harness import RankContext, StrategySpec, Unsupported, run_on_ranks

pytest.importorskip(
    "lightning",
    reason="environment: lightning is not installed (pip install 'shardcheck[lightning]')",
)

from lightning.fabric.plugins.precision import (
    FSDPPrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
)
from lightning.fabric.strategies import FSDPStrategy, ModelParallelStrategy

from harness.adapters.lightning import HarnessEnvironment, factory, make_strategy

CPU = torch.device("cpu")


def data_parallel(module: nn.Module, mesh: Any) -> nn.Module:
    """A thin parallelize_fn: FSDP2 on each Linear and on the root, over the DP dim."""
    from torch.distributed.fsdp import fully_shard

    for child in module.modules():
        if isinstance(child, nn.Linear):
            fully_shard(child, mesh=mesh["data_parallel"])
    fully_shard(module, mesh=mesh["data_parallel"])
    return module


def mp_spec(rank: int = 1, world_size: int = 2, **options: Any) -> StrategySpec:
    return StrategySpec(
        "model_parallel",
        rank,
        world_size,
        CPU,
        parallelize_fn=data_parallel,
        data_parallel_size=world_size,
        tensor_parallel_size=1,
        **options,
    )


# -- construction only (no process group needed) ----------------------------------------------


def test_model_parallel_is_lightnings_own_class_with_the_rank_wired_in() -> None:
    strategy = make_strategy(mp_spec(rank=1, world_size=2))
    assert type(strategy) is ModelParallelStrategy
    assert isinstance(strategy.cluster_environment, HarnessEnvironment)
    assert (strategy.global_rank, strategy.local_rank, strategy.world_size) == (1, 1, 2)
    assert strategy.root_device == CPU
    assert strategy.parallel_devices == [CPU, CPU]
    assert type(strategy.precision) is Precision
    # the contract's method is Lightning's own backward-sync control
    sync = strategy.no_backward_sync(nn.Linear(2, 2), enabled=True)
    assert type(sync).__name__ == "_FSDPNoSync"
    with pytest.raises(RuntimeError, match="device mesh before processes have initialized"):
        _ = strategy.device_mesh  # Lightning's behaviour is not hidden
    with pytest.raises(NotImplementedError):
        _ = strategy.checkpoint_io


@pytest.mark.parametrize(
    ("precision", "plugin"),
    [
        ("32-true", Precision),
        ("bf16-true", HalfPrecision),
        ("16-true", HalfPrecision),
        ("bf16-mixed", MixedPrecision),
    ],
)
def test_model_parallel_precisions_map_to_fabrics_plugins(precision: str, plugin: type) -> None:
    strategy = make_strategy(mp_spec(precision=precision))
    assert type(strategy.precision) is plugin


def test_model_parallel_16_mixed_is_unsupported_and_bad_precision_is_an_error() -> None:
    with pytest.raises(Unsupported) as info:
        make_strategy(mp_spec(precision="16-mixed"))
    assert info.value.describe().startswith("unsupported: precision=16-mixed (Lightning Fabric")
    with pytest.raises(ValueError, match="precision='64-true' is not a precision of"):
        make_strategy(mp_spec(precision="64-true"))


def test_fsdp_on_cpu_is_unsupported_with_the_reason() -> None:
    spec = StrategySpec("fsdp", 0, 2, CPU, precision="bf16-mixed")
    with pytest.raises(Unsupported) as info:
        make_strategy(spec)
    text = info.value.describe()
    assert text.startswith("unsupported: device=cpu (Lightning ")
    assert "device_id=None" in text and "FSDP needs a non-CPU accelerator device" in text


def test_fsdp_constructor_errors_are_lightnings_own() -> None:
    # construction runs before the CPU refusal, so validation clauses still see Lightning's
    # behaviour (here: Lightning 2.6 raises KeyError, not the ValueError CFG-1 asks for)
    with pytest.raises(Exception, match="BOGUS") as info:
        make_strategy(StrategySpec("fsdp", 0, 2, CPU, sharding_strategy="BOGUS"))
    assert not isinstance(info.value, Unsupported)


class CpuFSDP(FSDPStrategy):
    """A user subclass that overrides setup_module (so the CPU refusal does not apply)."""

    def setup_module(self, module: nn.Module) -> nn.Module:
        return module


class MyModelParallel(ModelParallelStrategy):
    """A user subclass."""


def test_factory_builds_subclasses_and_refuses_missing_families() -> None:
    make = factory(fsdp_cls=CpuFSDP)
    strategy = make(StrategySpec("fsdp", 0, 2, CPU, sharding_strategy="SHARD_GRAD_OP"))
    assert type(strategy) is CpuFSDP
    assert type(strategy.precision) is FSDPPrecision
    assert strategy.no_backward_sync(nn.Linear(2, 2), enabled=False) is not None
    with pytest.raises(Unsupported, match="family=model_parallel"):
        make(mp_spec())
    assert type(factory(model_parallel_cls=MyModelParallel)(mp_spec())) is MyModelParallel


def test_factory_refuses_classes_of_the_wrong_kind() -> None:
    with pytest.raises(TypeError, match=r"factory\(fsdp_cls=.*\) needs a subclass of .*FSDP"):
        factory(fsdp_cls=MyModelParallel)
    with pytest.raises(TypeError, match=r"model_parallel_cls=.*ModelParallelStrategy"):
        factory(model_parallel_cls=object)  # type: ignore[arg-type]


# -- on real ranks ----------------------------------------------------------------------------


def _gathered(model: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True)
    return {k: v.clone() for k, v in get_model_state_dict(model, options=options).items()}


def lightning_model_parallel_job(ctx: RankContext, checkpoint: str) -> dict[str, Any]:
    strategy = make_strategy(mp_spec(ctx.rank, ctx.world_size))
    strategy.setup_environment()
    torch.manual_seed(0)
    with strategy.module_init_context(empty_init=False):
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model = strategy.setup_module(model)
    opt = strategy.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(ctx.rank))
    for _ in range(2):
        with strategy.precision.forward_context():
            loss = model(strategy.precision.convert_input(x)).sum()
        strategy.backward(loss, model)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    with strategy.no_backward_sync(model, enabled=True):
        pass
    saved = _gathered(model)
    strategy.save_checkpoint(checkpoint, {"model": model, "optimizer": opt, "step": 2})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    rest = strategy.load_checkpoint(checkpoint, {"model": model, "optimizer": opt})
    loaded = _gathered(model)
    try:
        strategy.teardown()
        teardown = None
    except NotImplementedError as exc:
        teardown = str(exc)
    return {
        "class": type(strategy).__qualname__,
        "mesh": strategy.device_mesh.mesh_dim_names,
        "sampler": strategy.distributed_sampler_kwargs,
        "rest": rest,
        "restored": sorted(saved) == sorted(loaded)
        and all(torch.equal(saved[k], loaded[k]) for k in saved),
        "teardown": teardown,
        "pg_alive": dist.is_initialized(),
    }


def test_lightning_model_parallel_trains_and_checkpoints_on_ranks(tmp_path: Path) -> None:
    results = run_on_ranks(lightning_model_parallel_job, str(tmp_path / "ckpt"), world_size=2)
    for rank, result in enumerate(results):
        assert result["class"] == "ModelParallelStrategy"
        assert result["mesh"] == ("data_parallel", "tensor_parallel")
        assert result["sampler"] == {"num_replicas": 2, "rank": rank}
        assert result["rest"] == {"step": 2}
        assert result["restored"] is True
        assert result["pg_alive"] is True
        # Lightning 2.6.6 finding (API-8): Strategy.teardown() calls self.checkpoint_io, which
        # these strategies make raise; the adapter must let the suites see that.
        assert result["teardown"] in (None, results[0]["teardown"])
        if result["teardown"] is not None:
            assert "does not use the `CheckpointIO` plugin interface" in result["teardown"]
