"""FSDPStrategy construction, validation and API surface (CONTRACT.md sections 1 and 2).

Constructor checks that need no process group run in the controller; the rest run on ranks
and go through ``ctx.make_strategy`` (the default factory, ``reference_impl:make_strategy``),
the way the suites reach them.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffload, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

from harness import StrategySpec, Unsupported, run_on_ranks
from reference_impl import FSDPStrategy, make_strategy
from reference_impl.fsdp_options import has_accelerator


# ---------------------------------------------------------------------- controller-side
@pytest.mark.parametrize(
    "value", ["full_shard", "Shard_Grad_Op", "NO_SHARD", "hybrid_shard", "_hybrid_shard_zero2"]
)
def test_sharding_strategy_names_any_case(value: str) -> None:
    """CFG-1: the five names in any case (hybrid needs a policy, CFG-2)."""
    strategy = FSDPStrategy(sharding_strategy=value, auto_wrap_policy={nn.Linear})
    assert strategy.sharding_strategy is ShardingStrategy[value.upper()]


def test_sharding_strategy_enum_and_unknown() -> None:
    """CFG-1: the enum is accepted; anything else is a ValueError naming it and the choices."""
    enum = ShardingStrategy.SHARD_GRAD_OP
    assert FSDPStrategy(sharding_strategy=enum).sharding_strategy is enum
    with pytest.raises(ValueError, match=r"'FULLY_SHARD'.*FULL_SHARD, SHARD_GRAD_OP, NO_SHARD"):
        FSDPStrategy(sharding_strategy="FULLY_SHARD")
    with pytest.raises(ValueError, match="sharding_strategy=3"):
        FSDPStrategy(sharding_strategy=3)  # type: ignore[arg-type]


def test_hybrid_needs_a_way_to_form_groups() -> None:
    """CFG-2: hybrid without policy/group/mesh is a RuntimeError; group + mesh a ValueError."""
    with pytest.raises(RuntimeError, match="HYBRID_SHARD needs an auto_wrap_policy"):
        FSDPStrategy(sharding_strategy="HYBRID_SHARD")
    FSDPStrategy(sharding_strategy="HYBRID_SHARD", device_mesh=(1, 1))
    with pytest.raises(ValueError, match="process_group and device_mesh"):
        FSDPStrategy(sharding_strategy="HYBRID_SHARD", device_mesh=(1, 1), process_group=object())


def test_device_mesh_shape_checks() -> None:
    """CFG-3: a mesh tuple must be two positive ints and is for hybrid sharding only."""
    with pytest.raises(TypeError, match=r"device_mesh=\(2, 0\)"):
        FSDPStrategy(sharding_strategy="HYBRID_SHARD", device_mesh=(2, 0))
    with pytest.raises(ValueError, match="only applies to hybrid sharding"):
        FSDPStrategy(sharding_strategy="FULL_SHARD", device_mesh=(1, 2))


def test_policies_and_deprecated_activation_checkpointing() -> None:
    """CFG-4: sets, policy objects and callables; the deprecated form warns; both -> ValueError."""
    assert isinstance(FSDPStrategy(auto_wrap_policy={nn.Linear}).auto_wrap_policy, ModuleWrapPolicy)
    policy = ModuleWrapPolicy({nn.Linear})
    assert FSDPStrategy(activation_checkpointing_policy=policy).activation_checkpointing_policy is (
        policy
    )
    assert FSDPStrategy(auto_wrap_policy=size_based_auto_wrap_policy).auto_wrap_policy is (
        size_based_auto_wrap_policy
    )
    with pytest.warns(DeprecationWarning, match="activation_checkpointing is deprecated"):
        strategy = FSDPStrategy(activation_checkpointing=nn.Linear)
    assert isinstance(strategy.activation_checkpointing_policy, ModuleWrapPolicy)
    with pytest.warns(DeprecationWarning):
        FSDPStrategy(activation_checkpointing=[nn.Linear, nn.LayerNorm])
    with pytest.raises(ValueError, match="activation_checkpointing_policy"):
        FSDPStrategy(
            activation_checkpointing=nn.Linear, activation_checkpointing_policy={nn.Linear}
        )
    with pytest.raises(TypeError, match="auto_wrap_policy=42"):
        FSDPStrategy(auto_wrap_policy=42)
    with pytest.raises(TypeError, match=r"nn\.Module subclasses"):
        FSDPStrategy(auto_wrap_policy={"Linear"})


def test_use_orig_params_default_and_unknown_kwargs() -> None:
    """CFG-5 default, CFG-10: unknown keyword arguments are refused by name, never dropped."""
    assert FSDPStrategy()._fsdp_kwargs["use_orig_params"] is True
    assert FSDPStrategy(use_orig_params=False)._fsdp_kwargs["use_orig_params"] is False
    with pytest.raises(TypeError, match="use_orig_param"):
        FSDPStrategy(use_orig_param=False)
    with pytest.raises(ValueError, match="state_dict_type='fsdp'"):
        FSDPStrategy(state_dict_type="fsdp")


@pytest.mark.skipif(has_accelerator(), reason="checks the refusal on a machine without one")
def test_cpu_offload_without_accelerator() -> None:
    """CFG-6: bool or CPUOffload; parameter offload is refused clearly, never a crash."""
    assert FSDPStrategy(cpu_offload=False).cpu_offload == CPUOffload(offload_params=False)
    for value in (True, CPUOffload(offload_params=True)):
        with pytest.raises(ValueError, match="no accelerator"):
            FSDPStrategy(cpu_offload=value)
    with pytest.raises(TypeError, match="cpu_offload='yes'"):
        FSDPStrategy(cpu_offload="yes")  # type: ignore[arg-type]
    spec = StrategySpec("fsdp", 0, 1, torch.device("cpu"), cpu_offload=True)
    with pytest.raises(Unsupported) as info:
        make_strategy(spec)
    assert info.value.option == "cpu_offload"


def test_precision_and_foreign_spec_fields() -> None:
    """CFG-7 and CFG-10 through the factory."""
    with pytest.raises(ValueError, match=r"'64-true'.*32-true"):
        make_strategy(StrategySpec("fsdp", 0, 1, torch.device("cpu"), precision="64-true"))
    with pytest.raises(ValueError, match="parallelize_fn"):
        make_strategy(StrategySpec("fsdp", 0, 1, torch.device("cpu"), parallelize_fn=print))
    strategy = make_strategy(
        StrategySpec("fsdp", 0, 1, torch.device("cpu"), extra={"limit_all_gathers": False})
    )
    assert strategy._fsdp_kwargs["limit_all_gathers"] is False


def test_checkpoint_io_is_refused() -> None:
    """API-7: getting or setting checkpoint_io raises NotImplementedError."""
    strategy = FSDPStrategy()
    with pytest.raises(NotImplementedError, match="checkpoint_io"):
        _ = strategy.checkpoint_io
    with pytest.raises(NotImplementedError, match="checkpoint_io"):
        strategy.checkpoint_io = object()


# ---------------------------------------------------------------------- on ranks
def rank_api_surface(ctx: Any) -> dict:
    world = dist.group.WORLD
    strategy = ctx.make_strategy("fsdp", auto_wrap_policy={nn.Linear})
    strategy.setup_environment()
    assert dist.group.WORLD is world  # API-1: reused, not re-initialized
    out: dict[str, Any] = {
        "device": str(strategy.root_device),
        "sampler": strategy.distributed_sampler_kwargs,
        "mean": strategy.all_reduce(torch.tensor(float(ctx.rank)), reduce_op="mean").item(),
        "sum": strategy.all_reduce(torch.tensor(ctx.rank + 1), reduce_op="sum").item(),
        "int_mean": strategy.all_reduce(torch.tensor(ctx.rank), reduce_op="mean").item(),
        "plain": strategy.all_reduce(7, reduce_op="sum"),
        "broadcast": strategy.broadcast({"from": ctx.rank, "x": [1, 2]}, src=ctx.world_size - 1),
    }
    strategy.barrier("here")
    # API-2: setup_module_and_optimizers with an optimizer created before setup.
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, (opt2,) = strategy.setup_module_and_optimizers(model, [opt])
    assert opt2 is opt
    strategy.backward(model(torch.ones(2, 4)).sum(), model)
    strategy.optimizer_step(opt)
    with pytest.raises(ValueError, match="after setup_module"):
        strategy.setup_optimizer(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))
    with pytest.raises(TypeError, match="storage_options"):
        strategy.save_checkpoint(ctx.tmp_dir, {"model": model}, storage_options={"a": 1})
    strategy.teardown()
    out["pg_alive"] = dist.is_initialized() and dist.group.WORLD is world  # API-8
    return out


def test_api_surface() -> None:
    """API-1,2,5,6,8 and the storage_options refusal on two ranks."""
    results = run_on_ranks(rank_api_surface, world_size=2)
    for rank, res in enumerate(results):
        assert res["device"] == "cpu"
        assert res["sampler"] == {"num_replicas": 2, "rank": rank}
        assert res["mean"] == 0.5 and res["sum"] == 3 and res["int_mean"] == 0.5
        assert res["plain"] == 7
        assert res["broadcast"] == {"from": 1, "x": [1, 2]}
        assert res["pg_alive"]


def rank_world_dependent_errors(ctx: Any) -> None:
    # CFG-3: a (replicate, shard) product different from the world size names both.
    with pytest.raises(ValueError, match=r"\(2, 2\).*world size is 2"):
        ctx.make_strategy("fsdp", sharding_strategy="HYBRID_SHARD", device_mesh=(2, 2))
    # CFG-5: use_orig_params=False.
    strategy = ctx.make_strategy("fsdp", extra={"use_orig_params": False})
    strategy.setup_environment()
    model = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="use_orig_params=True"):
        strategy.setup_module_and_optimizers(model, [torch.optim.SGD(model.parameters(), lr=1)])
    early = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = strategy.setup_module(model)
    with pytest.raises(ValueError, match=r"use_orig_params=False.*after setup_module"):
        strategy.setup_optimizer(early)
    late = strategy.setup_optimizer(torch.optim.SGD(wrapped.parameters(), lr=0.1))
    strategy.backward(wrapped(torch.ones(1, 4)).sum(), wrapped)
    strategy.optimizer_step(late)
    # CFG-6 through the harness: declared Unsupported on every rank.
    if not has_accelerator():
        with pytest.raises(Unsupported, match="cpu_offload"):
            ctx.make_strategy("fsdp", cpu_offload=True)
    # Hybrid with only a wrap policy: one replica per node (here (1, world)).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy = ctx.make_strategy(
            "fsdp", sharding_strategy="HYBRID_SHARD", auto_wrap_policy={nn.Linear}
        )
        strategy.setup_environment()
        assert tuple(strategy.device_mesh.shape) == (1, ctx.world_size)


def test_world_dependent_errors() -> None:
    """CFG-3, CFG-5, CFG-6 on ranks (asserted inside every rank)."""
    run_on_ranks(rank_world_dependent_errors, world_size=2)
