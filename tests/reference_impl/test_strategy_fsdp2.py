"""FSDP2Strategy: construction, the units it shards, reshard_after_forward, HSDP, parity.

Constructor checks run in the controller; the rest run on ranks through ``make_strategy``
with a ``fsdp2`` spec, the way the suites build it. Gathered parameters are read with
``get_model_state_dict(full_state_dict=True)`` and compared with the plain model trained on
the concatenated batch.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule
from torch.distributed.tensor import DTensor

from harness import StrategySpec, Unsupported, max_world_size, run_on_ranks
from reference_impl import FSDP2Strategy, make_strategy
from reference_impl.fsdp_options import has_accelerator

FULL = StateDictOptions(full_state_dict=True)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 6)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(6, 5)  # 5 rows: uneven shards at world 2 and 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.inp(x)))


# ---------------------------------------------------------------------- controller-side
def test_constructor_refuses_bad_options_by_name() -> None:
    with pytest.raises(TypeError, match=r"reshard_after_forward='yes' must be a bool or an int"):
        FSDP2Strategy(reshard_after_forward="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"reshard_after_forward=0 must be at least 1"):
        FSDP2Strategy(reshard_after_forward=0)
    with pytest.raises(TypeError, match=r"auto_wrap_policy=.*not a wrap policy"):
        FSDP2Strategy(auto_wrap_policy=3)
    with pytest.raises(TypeError, match=r"device_mesh=\(2,\) must be a tuple \(replicate, shard\)"):
        FSDP2Strategy(device_mesh=(2,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"state_dict_type='dcp' is not supported"):
        FSDP2Strategy(state_dict_type="dcp")


@pytest.mark.skipif(has_accelerator(), reason="offload is refused only without an accelerator")
def test_offload_is_refused_without_an_accelerator() -> None:
    """CFG-6: ValueError from the constructor, Unsupported from the factory."""
    with pytest.raises(ValueError, match=r"cpu_offload=True .* no accelerator"):
        FSDP2Strategy(cpu_offload=True)
    with pytest.raises(ValueError, match=r"no accelerator"):
        FSDP2Strategy(cpu_offload=CPUOffloadPolicy())
    spec = StrategySpec("fsdp2", 0, 1, torch.device("cpu"), cpu_offload=True)
    with pytest.raises(Unsupported, match=r"cpu_offload"):
        make_strategy(spec)


@pytest.mark.parametrize(
    "family,field,value",
    [
        ("fsdp2", "sharding_strategy", "NO_SHARD"),
        ("fsdp2", "data_parallel_size", 2),
        ("fsdp", "reshard_after_forward", False),
        ("model_parallel", "reshard_after_forward", 2),
    ],
)
def test_a_field_of_another_family_is_refused(family: str, field: str, value: Any) -> None:
    """CFG-10: each family refuses the fields it does not read."""
    spec = StrategySpec(family, 0, 1, torch.device("cpu"), **{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"StrategySpec.{field}={value!r} is not an option"):
        make_strategy(spec)


# ---------------------------------------------------------------------- on ranks
def _plain_steps(seed: int, batches: list[torch.Tensor], steps: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        loss = torch.cat([model(b) for b in batches]).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach() for k, v in model.state_dict().items()}


def rank_units_and_parity(ctx: Any, reshard: bool | int, mesh: tuple[int, int] | None) -> str:
    """Units are Block and the root; after a forward the parameters are as asked; two
    steps match the plain model on all batches."""
    strategy = ctx.make_strategy(
        "fsdp2", auto_wrap_policy={Block}, reshard_after_forward=reshard, device_mesh=mesh
    )
    strategy.setup_environment()
    torch.manual_seed(0)
    model = strategy.setup_module(Net())
    units = sorted(n for n, m in model.named_modules() if isinstance(m, FSDPModule))
    assert units == ["", "blocks.0", "blocks.1"], units
    opt = strategy.setup_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    gen = torch.Generator().manual_seed(7)
    batches = [torch.randn(2, 3, generator=gen) for _ in range(ctx.world_size)]
    for step in range(2):
        out = model(batches[ctx.rank])
        fc1 = model.blocks[0].fc1.weight
        if reshard is False:
            assert not isinstance(fc1, DTensor) and fc1.shape == (8, 6)
        else:
            over = ctx.world_size if reshard is True else reshard
            over = over if mesh is None or reshard is not True else mesh[1]
            assert isinstance(fc1, DTensor) and fc1.to_local().shape[0] == 8 // over, step
        strategy.backward(out.pow(2).mean(), model)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    gathered = get_model_state_dict(model, options=FULL)
    expected = _plain_steps(0, batches, 2)
    for name, value in expected.items():
        torch.testing.assert_close(gathered[name], value, rtol=1e-5, atol=1e-6, msg=name)
    strategy.teardown()
    return "ok"


CASES = [(True, None), (False, None), (2, None), (True, (2, 2))]


@pytest.mark.parametrize("reshard,mesh", CASES, ids=["true", "false", "int2", "hsdp2x2"])
def test_units_reshard_and_parity(reshard: bool | int, mesh: tuple[int, int] | None) -> None:
    if max_world_size() < 4:
        pytest.skip("environment: needs world size 4")
    results = run_on_ranks(rank_units_and_parity, reshard, mesh, world_size=4)
    assert results == ["ok"] * 4


def rank_mixed_precision(ctx: Any) -> tuple[str, str, str]:
    strategy = ctx.make_strategy("fsdp2", precision="bf16-mixed", auto_wrap_policy={Block})
    strategy.setup_environment()
    model = strategy.setup_module(Net())
    seen: list[torch.dtype] = []
    model.blocks[0].fc1.register_forward_pre_hook(lambda m, a: seen.append(m.weight.dtype))
    with strategy.precision.forward_context():
        out = model(strategy.precision.convert_input(torch.randn(2, 3)))
    out.float().sum().backward()
    policy = strategy.mp_policy
    strategy.teardown()
    return str(seen[0]), str(policy.reduce_dtype), str(model.head.weight.grad.dtype)


def test_bf16_mixed_policy() -> None:
    """Parameters in forward and the reduction in bf16; sharded gradients stay float32."""
    results = run_on_ranks(rank_mixed_precision, world_size=2)
    assert results == [("torch.bfloat16", "torch.bfloat16", "torch.float32")] * 2


def test_the_fsdp2_example_factory_builds_and_refuses() -> None:
    """examples/my_fsdp2.py: builds an FSDP2Strategy from an fsdp2 spec, refuses the other
    families with Unsupported and another family's field with ValueError naming it."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "my_fsdp2.py"
    loader = importlib.util.spec_from_file_location("my_fsdp2", path)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    cpu = torch.device("cpu")
    built = module.make_strategy(
        StrategySpec("fsdp2", 0, 1, cpu, auto_wrap_policy={Block}, reshard_after_forward=False)
    )
    assert isinstance(built, FSDP2Strategy) and built.reshard_after_forward is False
    with pytest.raises(Unsupported, match="family=fsdp"):
        module.make_strategy(StrategySpec("fsdp", 0, 1, cpu))
    with pytest.raises(ValueError, match=r"sharding_strategy='NO_SHARD' is not an option"):
        module.make_strategy(StrategySpec("fsdp2", 0, 1, cpu, sharding_strategy="NO_SHARD"))
