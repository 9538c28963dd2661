"""Precision plugins: resolution, dtypes, FSDP settings, and the 16-mixed scaler on CPU ranks.

Single-process checks run in the controller; the dtype and scaler behaviour under FSDP runs
on two CPU ranks through the harness (PREC-1..4, CFG-7, API-4).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

from harness import run_on_ranks
from reference_impl.precision import (
    PRECISION_MODES,
    BF16MixedPrecision,
    FP16MixedPrecision,
    FP32Precision,
    Precision,
    resolve_precision,
)

FULL = StateDictOptions(full_state_dict=True)
LOW = {"16": torch.float16, "bf16": torch.bfloat16, "32": torch.float32}


def _low(mode: str) -> torch.dtype:
    return LOW[mode.split("-")[0]]


# ---------------------------------------------------------------------- controller-side
def test_resolve_precision() -> None:
    """CFG-7: the five strings, an instance as is, None = 32-true; else ValueError/TypeError."""
    assert [resolve_precision(m).name for m in PRECISION_MODES] == list(PRECISION_MODES)
    plugin = BF16MixedPrecision()
    assert resolve_precision(plugin) is plugin
    assert isinstance(resolve_precision(None), FP32Precision)
    with pytest.raises(ValueError, match=r"precision='16'.*16-mixed"):
        resolve_precision("16")
    with pytest.raises(TypeError, match=r"precision=16 \(type int\)"):
        resolve_precision(16)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", PRECISION_MODES)
def test_dtypes_of_each_mode(mode: str) -> None:
    """PREC-1/3: init dtype of true modes; convert_input; forward dtype; default restored."""
    plugin = resolve_precision(mode)
    plugin.bind_device(torch.device("cpu"))
    true_mode = mode.endswith("-true")
    with plugin.module_init_context():
        layer = nn.Linear(3, 2)
    assert layer.weight.dtype == (_low(mode) if true_mode else torch.float32)
    data = OrderedDict(x=torch.ones(1, 3), idx=torch.tensor([1]), rest=[torch.zeros(2)])
    converted = plugin.convert_input(data)
    assert converted["x"].dtype == layer.weight.dtype and converted["idx"].dtype == torch.int64
    assert converted["rest"][0].dtype == layer.weight.dtype
    with plugin.forward_context():
        out = layer(converted["x"])
    assert out.dtype == _low(mode)
    assert torch.get_default_dtype() == torch.float32
    assert plugin.is_mixed == mode.endswith("-mixed")


def test_fsdp_settings() -> None:
    """PREC-2: mixed modes compute and reduce in the low dtype; true modes need no setting."""
    for mode in ("32-true", "16-true", "bf16-true"):
        plugin = resolve_precision(mode)
        assert plugin.mixed_precision_config() is None
        assert plugin.mixed_precision_policy() is None
    for mode in ("16-mixed", "bf16-mixed"):
        low = _low(mode)
        plugin = resolve_precision(mode)
        # buffers stay at their stored dtype: see [Note: buffers stay at their stored dtype];
        # no module class is left out of mixed precision (FSDP1 would wrap every BatchNorm in
        # a unit of its own: see [Note: running statistics compute in the parameters' dtype])
        config = MixedPrecision(low, low, None, _module_classes_to_ignore=())
        assert plugin.mixed_precision_config() == config
        assert plugin.mixed_precision_policy() == MixedPrecisionPolicy(low, low)


def test_scaler_only_for_16_mixed_and_on_the_bound_device() -> None:
    """PREC-2: ShardedGradScaler(device=<type>) for 16-mixed, CPU included; state round-trips."""
    assert all(resolve_precision(m).scaler is None for m in PRECISION_MODES)
    plugin = FP16MixedPrecision()
    plugin.bind_device(torch.device("cpu"))
    assert plugin.scaler is not None and plugin.scaler._device == "cpu"
    assert plugin.scaler.is_enabled()
    state = plugin.state_dict()
    assert state["scale"] == 2.0**16
    plugin.load_state_dict({**state, "scale": 8.0})
    assert plugin.scaler.get_scale() == 8.0
    plugin.teardown()
    assert plugin.scaler is None
    assert isinstance(plugin, Precision)


# ---------------------------------------------------------------------- on ranks
class BufNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)
        self.register_buffer("shift", torch.full((4,), 0.5))
        self.seen: torch.dtype | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = self.shift.dtype
        return self.out(torch.tanh(self.lin(x)) + self.shift)


def _batch(world_size: int) -> torch.Tensor:
    return torch.randn(world_size * 2, 4, generator=torch.Generator().manual_seed(5))


def rank_dtypes(ctx: Any, mode: str) -> dict:
    strategy = ctx.make_strategy("fsdp", precision=mode, auto_wrap_policy={nn.Linear})
    strategy.setup_environment()
    torch.manual_seed(0)
    with strategy.module_init_context(empty_init=False):
        model = BufNet()
    model = strategy.setup_module(model)
    opt = strategy.setup_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-4))
    x = _batch(ctx.world_size)[ctx.rank * 2 : ctx.rank * 2 + 2]
    with strategy.precision.forward_context():
        out = model(strategy.precision.convert_input(x))
    strategy.backward(out.float().pow(2).mean(), model)
    grad_dtypes = {str(p.grad.dtype) for p in model.parameters() if p.grad is not None}
    strategy.optimizer_step(opt)
    full = get_model_state_dict(model, options=FULL)
    return {
        "out": str(out.dtype),
        "buffer_in_forward": str(model.module.seen),
        "params": sorted({str(p.dtype) for p in model.parameters()}),
        "grads": sorted(grad_dtypes),
        "state": sorted({str(s["exp_avg"].dtype) for s in opt.state.values()}),
        "saved": {k: str(v.dtype) for k, v in full.items()},
    }


@pytest.mark.parametrize("mode", PRECISION_MODES)
def test_dtypes_under_fsdp(mode: str) -> None:
    """PREC-1..4 on two ranks: stored, compute, gradient, optimizer and saved dtypes."""
    true_mode = mode.endswith("-true")
    stored = str(_low(mode) if true_mode else torch.float32)
    for res in run_on_ranks(rank_dtypes, mode, world_size=2):
        assert res["out"] == str(_low(mode))
        # true modes store buffers in the low dtype; mixed modes keep them at float32
        assert res["buffer_in_forward"] == stored
        assert res["params"] == [stored] and res["grads"] == [stored]
        assert res["state"] == [stored]
        assert set(res["saved"].values()) == {stored}  # buffers saved at their stored dtype


def rank_scaler(ctx: Any) -> dict:
    strategy = ctx.make_strategy("fsdp", precision="16-mixed")
    strategy.setup_environment()
    torch.manual_seed(0)
    ref = BufNet()
    model = strategy.setup_module(copy.deepcopy(ref))
    opt = strategy.setup_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-4))
    scaler = strategy.precision.scaler
    x = _batch(ctx.world_size)
    mine = x[ctx.rank * 2 : ctx.rank * 2 + 2]

    def backward() -> None:
        with strategy.precision.forward_context():
            out = model(strategy.precision.convert_input(mine))
        strategy.backward(out.float().pow(2).mean(), model)

    out: dict[str, Any] = {"device": scaler._device, "scale0": scaler.get_scale()}
    # An inf gradient on rank 1 only: every rank skips the step and backs off.
    backward()
    if ctx.rank == 1:
        next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")
    before = get_model_state_dict(model, options=FULL)
    strategy.optimizer_step(opt)
    opt.zero_grad()
    after = get_model_state_dict(model, options=FULL)
    out["skipped"] = all(torch.equal(before[k], after[k]) for k in before)
    out["scale1"] = scaler.get_scale()
    # Clipping unscales first: the norm is that of the true gradients.
    backward()
    out["norm"] = float(strategy.clip_gradients_norm(model, opt, max_norm=100.0))
    strategy.optimizer_step(opt)
    after2 = get_model_state_dict(model, options=FULL)
    out["stepped"] = not all(torch.equal(after[k], after2[k]) for k in after)
    out["master"] = sorted({str(p.dtype) for p in model.parameters()})
    ref(x).pow(2).mean().backward()
    out["ref_norm"] = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 100.0))
    return out


def test_16_mixed_scaler_on_cpu() -> None:
    """PREC-2, API-4: inf on one rank skips the step everywhere; clipping unscales first."""
    for res in run_on_ranks(rank_scaler, world_size=2):
        assert res["device"] == "cpu"
        assert res["skipped"] and res["scale1"] == res["scale0"] / 2
        assert res["stepped"] and res["master"] == ["torch.float32"]
        assert res["norm"] == pytest.approx(res["ref_norm"], rel=2e-2)
