"""Integer-keyed optimizer state (plain torch, trainer layout) and the rekeying helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

from harness import run_on_ranks
from reference_impl.checkpoint import (
    is_standard_optimizer_state,
    load_checkpoint,
    plain_param_names,
    save_checkpoint,
    to_named_optimizer_state,
    to_standard_optimizer_state,
)


class Small(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(5, 7)
        self.b = nn.Linear(7, 3)
        self.register_buffer("shift", torch.rand(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x))) + self.shift


def grouped_adam(model: nn.Module) -> torch.optim.Optimizer:
    """Two groups in an order different from ``model.parameters()``: b's first, then a's."""
    named = list(model.named_parameters())
    return torch.optim.Adam(
        [
            {"params": [p for n, p in named if n.split(".")[-2] == "b"], "lr": 0.02},
            {"params": [p for n, p in named if n.split(".")[-2] == "a"], "lr": 0.01},
        ]
    )


def trained_plain() -> tuple[Small, torch.optim.Optimizer]:
    model, gen = Small(seed=0), torch.Generator().manual_seed(7)
    opt = grouped_adam(model)
    for _ in range(3):
        model(torch.randn(4, 5, generator=gen)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def shard(model: nn.Module, family: str) -> nn.Module:
    if family == "fsdp1":
        return FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
    fully_shard(model)
    return model


def assert_equal_state(actual: Any, expected: Any, path: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert torch.equal(actual, expected), f"{path} differs"
    elif isinstance(expected, dict):
        assert set(actual) == set(expected), f"{path}: keys {set(actual)} != {set(expected)}"
        for key in expected:
            assert_equal_state(actual[key], expected[key], f"{path}.{key}")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def rank_load_plain(ctx: Any, family: str, out: str) -> None:
    plain, plain_opt = trained_plain()
    names = plain_param_names(plain, plain_opt)
    expected_state = {
        name: plain_opt.state[p]
        for group, group_names in zip(plain_opt.param_groups, names, strict=True)
        for p, name in zip(group["params"], group_names, strict=True)
    }
    options = StateDictOptions(full_state_dict=True)
    for file, model_key, opt_key in [
        ("plain.pt", "model", "optimizer"),
        ("trainer.pt", "state_dict", "optimizer_states"),
    ]:
        model = shard(Small(seed=1), family)
        opt = grouped_adam(model)
        value = [opt] if opt_key == "optimizer_states" else opt
        state = {model_key: model, opt_key: value, "epoch": 0}
        assert load_checkpoint(Path(out) / file, state, strict=True) == {}
        assert state["epoch"] == 3
        assert_equal_state(get_model_state_dict(model, options=options), plain.state_dict(), file)
        osd = get_optimizer_state_dict(model, opt, options=options)
        assert_equal_state(osd["state"], expected_state, f"{file} optimizer")
        assert [g["lr"] for g in osd["param_groups"]] == [0.02, 0.01]
        assert [g["params"] for g in osd["param_groups"]] == names
    # the trainer layout written on request equals what the plain trainer wrote
    save_checkpoint(
        Path(out) / "again.pt",
        {"state_dict": model, "optimizer_states": [opt], "epoch": 3},
        full=True,
    )
    written = torch.load(Path(out) / "again.pt", weights_only=True)
    assert is_standard_optimizer_state(written["optimizer_states"][0])
    assert_equal_state(written["optimizer_states"][0], plain_opt.state_dict(), "trainer layout")
    # a count of optimizers different from the file's
    two = {"state_dict": model, "optimizer_states": [opt, grouped_adam(model)]}
    with pytest.raises(RuntimeError, match=r"holds 1 optimizer state\(s\).*but 2 optimizer"):
        load_checkpoint(Path(out) / "again.pt", two, strict=True)


@pytest.mark.parametrize("family", ["fsdp1", "fsdp2"])
def test_plain_and_trainer_integer_keyed_state_loads(tmp_path: Path, family: str) -> None:
    """CKPT-REKEY-1 and CKPT-TRAINER-1: ids map to names in param_groups order."""
    plain, opt = trained_plain()
    torch.save(
        {"model": plain.state_dict(), "optimizer": opt.state_dict(), "epoch": 3},
        tmp_path / "plain.pt",
    )
    torch.save(
        {"state_dict": plain.state_dict(), "optimizer_states": [opt.state_dict()], "epoch": 3},
        tmp_path / "trainer.pt",
    )
    run_on_ranks(rank_load_plain, family, str(tmp_path), world_size=2)


def test_standard_and_named_forms_round_trip() -> None:
    plain, opt = trained_plain()
    standard = opt.state_dict()
    names = plain_param_names(plain, opt)
    assert names == [["b.weight", "b.bias"], ["a.weight", "a.bias"]]
    named = to_named_optimizer_state(standard, names)
    assert not is_standard_optimizer_state(named) and is_standard_optimizer_state(standard)
    assert [g["params"] for g in named["param_groups"]] == names
    assert named["state"]["b.weight"]["exp_avg"] is standard["state"][0]["exp_avg"]
    assert_equal_state(to_standard_optimizer_state(named), standard, "round trip")


def test_rekeying_errors_name_the_group() -> None:
    _, opt = trained_plain()
    standard = opt.state_dict()
    with pytest.raises(ValueError, match=r"2 parameter group\(s\) but the optimizer has 1"):
        to_named_optimizer_state(standard, [["a.weight"]])
    with pytest.raises(ValueError, match=r"Parameter group 1 .* 2 parameter\(s\).* has 1"):
        to_named_optimizer_state(standard, [["b.weight", "b.bias"], ["a.weight"]])
    with pytest.raises(ValueError, match="not an optimizer state dict"):
        to_standard_optimizer_state({"weights": 1})
    stray = {"state": {"ghost": {}}, "param_groups": [{"params": ["a.weight"]}]}
    with pytest.raises(ValueError, match="'ghost'"):
        to_standard_optimizer_state(stray)
    with pytest.raises(ValueError, match="not a parameter of the module"):
        plain_param_names(Small(seed=2), opt)


def fsdp2_parallelize(module: nn.Module, device_mesh: Any) -> nn.Module:
    fully_shard(module, mesh=device_mesh["data_parallel"])
    return module


def rank_strategies_cross_family(ctx: Any, out: str) -> None:
    """Through the reference strategies: model_parallel <-> fsdp, full and sharded (MP-3)."""
    fsdp_opts = {"extra": {"use_orig_params": True}}
    makers = {
        "fsdp:full": lambda: ctx.make_strategy("fsdp", state_dict_type="full", **fsdp_opts),
        "fsdp:sharded": lambda: ctx.make_strategy("fsdp", state_dict_type="sharded", **fsdp_opts),
        "mp:full": lambda: ctx.make_strategy(
            "model_parallel",
            parallelize_fn=fsdp2_parallelize,
            data_parallel_size=2,
            tensor_parallel_size=1,
            save_distributed_checkpoint=False,
        ),
        "mp:sharded": lambda: ctx.make_strategy(
            "model_parallel",
            parallelize_fn=fsdp2_parallelize,
            data_parallel_size=2,
            tensor_parallel_size=1,
            save_distributed_checkpoint=True,
        ),
    }
    options = StateDictOptions(full_state_dict=True)
    for saver, loader in [
        ("mp:full", "fsdp:full"),
        ("fsdp:full", "mp:full"),
        ("mp:sharded", "mp:sharded"),
        ("fsdp:sharded", "fsdp:sharded"),
    ]:
        strategy = makers[saver]()
        strategy.setup_environment()
        model = strategy.setup_module(Small(seed=0))
        opt = strategy.setup_optimizer(grouped_adam(model))
        model(torch.randn(3, 5)).sum().backward()
        opt.step()
        expected = get_optimizer_state_dict(model, opt, options=options)
        path = Path(out) / saver.replace(":", "-")
        strategy.save_checkpoint(path, {"model": model, "optimizer": opt, "step": 1})
        assert path.is_file() == saver.endswith("full"), saver
        target = makers[loader]()
        target.setup_environment()
        fresh = target.setup_module(Small(seed=1))
        fresh_opt = target.setup_optimizer(grouped_adam(fresh))
        state = {"model": fresh, "optimizer": fresh_opt, "step": 0}
        assert target.load_checkpoint(path, state) == {} and state["step"] == 1
        assert_equal_state(
            get_model_state_dict(fresh, options=options),
            get_model_state_dict(model, options=options),
            f"{saver}->{loader}",
        )
        actual = get_optimizer_state_dict(fresh, fresh_opt, options=options)
        assert_equal_state(actual["state"], expected["state"], f"{saver}->{loader} optimizer")


def test_strategies_load_each_others_full_checkpoints(tmp_path: Path) -> None:
    """CKPT-RT-6 and MP-3 through make_strategy (both families, both formats)."""
    run_on_ranks(rank_strategies_cross_family, str(tmp_path), world_size=2)


def local_optimizer_state(model: nn.Module, opts: list[torch.optim.Optimizer]) -> list[Any]:
    """This rank's own optimizer state by parameter name, and the groups' hyper-parameters
    (an oracle at an unchanged world size; torch's FSDP1 reader refuses optimizers that split
    a flat parameter)."""
    names = {p: n for n, p in model.named_parameters()}
    return [
        (
            {names[p]: dict(s) for p, s in opt.state.items()},
            [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        )
        for opt in opts
    ]


def split_optimizers(model: nn.Module, family: str) -> list[torch.optim.Optimizer]:
    """Adam over a's parameters; over b's, SGD without momentum (no state at all) or, with
    FSDP1, another Adam: torch's FSDP1 optimizer state needs one state layout per unit."""
    named = list(model.named_parameters())
    a = [p for n, p in named if n.split(".")[-2] == "a"]
    b = [p for n, p in named if n.split(".")[-2] == "b"]
    if family == "fsdp1":
        return [torch.optim.Adam(a, lr=0.01), torch.optim.Adam(b, lr=0.02)]
    return [torch.optim.Adam(a, lr=0.01), torch.optim.SGD(b, lr=0.1)]


def rank_split_optimizers(ctx: Any, family: str, out: str) -> None:
    model = shard(Small(seed=0), family)  # one FSDP1 unit: both optimizers share its flat param
    opts = split_optimizers(model, family)
    gen = torch.Generator().manual_seed(ctx.rank)
    for _ in range(2):
        model(torch.randn(4, 5, generator=gen)).square().sum().backward()
        for opt in opts:
            opt.step()
            opt.zero_grad()
    expected = local_optimizer_state(model, opts)
    for full in (True, False):
        path = Path(out) / f"{family}-{full}"
        save_checkpoint(path, {"state_dict": model, "optimizer_states": opts}, full=full)
        fresh = shard(Small(seed=1), family)
        fresh_opts = split_optimizers(fresh, family)
        load_checkpoint(path, {"state_dict": fresh, "optimizer_states": fresh_opts}, strict=True)
        actual = local_optimizer_state(fresh, fresh_opts)
        for (a_state, a_groups), (e_state, e_groups) in zip(actual, expected, strict=True):
            assert_equal_state(a_state, e_state, f"{family} full={full} state")
            assert a_groups == e_groups, f"{family} full={full}: {a_groups} != {e_groups}"


@pytest.mark.parametrize("family", ["fsdp1", "fsdp2"])
def test_trainer_layout_with_optimizers_splitting_a_unit(tmp_path: Path, family: str) -> None:
    """CKPT-TRAINER-1: two optimizers over one FSDP1 unit; an optimizer without state."""
    run_on_ranks(rank_split_optimizers, family, str(tmp_path), world_size=2)
