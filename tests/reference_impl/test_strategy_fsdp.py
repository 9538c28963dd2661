"""FSDPStrategy on CPU ranks: parity, clipping, gradient-sync control, meta init, wrapping.

Every multi-rank check asserts inside the rank (``pytest.raises`` included) and returns what
the controller compares across ranks. Expected values come from the plain model trained in
the same process and from torch's own reader (``get_model_state_dict(full_state_dict=True)``),
never from the strategy's save.
"""

from __future__ import annotations

import copy
import math
import zlib
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from harness import run_on_ranks

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
FULL = StateDictOptions(full_state_dict=True)
MICRO = 3  # rows per rank and micro-batch


# ---------------------------------------------------------------------- models
class Block(nn.Module):
    def __init__(self, dim: int = 8, inner: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.inner = Block(dim) if inner else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(torch.tanh(self.lin(x))) + x
        return self.inner(y) if self.inner is not None else y


class Net(nn.Module):
    """Uneven sizes on purpose (5 and 3 are not multiples of the world size)."""

    def __init__(self, inner: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.blocks = nn.Sequential(Block(inner=inner), Block(inner=inner))
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))


class _Seeded:
    """``reset_parameters`` seeds itself from a name and counts real (non-meta) calls."""

    seed_name: str
    resets: int

    def _gen(self, slot: str) -> torch.Generator:
        return torch.Generator().manual_seed(zlib.crc32(f"{self.seed_name}.{slot}".encode()))


class SeededLinear(nn.Linear, _Seeded):
    def __init__(self, name: str, n_in: int, n_out: int, bias: bool = True) -> None:
        self.seed_name, self.resets = name, 0
        super().__init__(n_in, n_out, bias=bias)

    def reset_parameters(self) -> None:
        if self.weight.is_meta:
            return
        self.resets += 1
        with torch.no_grad():
            self.weight.copy_(torch.randn(self.weight.shape, generator=self._gen("w")) * 0.3)
            if self.bias is not None:
                self.bias.copy_(torch.randn(self.bias.shape, generator=self._gen("b")) * 0.1)


class SeededEmbedding(nn.Embedding, _Seeded):
    def __init__(self, name: str, num: int, dim: int) -> None:
        self.seed_name, self.resets = name, 0
        super().__init__(num, dim)
        self.register_buffer("scale", torch.empty(dim))
        self.register_buffer("offset", torch.empty(dim), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight.is_meta or not hasattr(self, "scale"):
            return
        self.resets += 1
        with torch.no_grad():
            self.weight.copy_(torch.randn(self.weight.shape, generator=self._gen("w")))
            self.scale.copy_(torch.rand(self.scale.shape, generator=self._gen("s")) + 0.5)
            self.offset.fill_(0.25)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return super().forward(idx) * self.scale + self.offset


class SeededBlock(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.lin = SeededLinear(f"{name}.lin", 6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) + x


class TiedNet(nn.Module):
    """Embedding tied to the output head; self-seeding init; buffers of both kinds."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = SeededEmbedding("emb", 7, 6)
        self.blocks = nn.Sequential(*(SeededBlock(f"blocks.{i}") for i in range(2)))
        self.head = SeededLinear("head", 6, 7, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.emb(idx)))


# ---------------------------------------------------------------------- helpers
def _batch(step: int, world_size: int, rows: int = MICRO) -> torch.Tensor:
    return torch.randn(world_size * rows, 5, generator=torch.Generator().manual_seed(100 + step))


def _mesh_for(strategy: str, world_size: int) -> tuple[int, int] | None:
    if "HYBRID" not in strategy:
        return None
    return (2, world_size // 2) if world_size >= 4 else (1, world_size)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _train_pair(ctx: Any, strategy: Any, model: nn.Module, ref: nn.Module, steps: int) -> dict:
    """Adam + clipping (norm orders 2, inf, 1) on both; gathered-state error and the norms."""
    opt = strategy.setup_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2))
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    norms, ref_norms, losses, ref_losses = [], [], [], []
    rows = slice(ctx.rank * MICRO, (ctx.rank + 1) * MICRO)
    for step in range(steps):
        x = _batch(step, ctx.world_size)
        loss = model(x[rows]).pow(2).mean()
        strategy.backward(loss, model)
        norm_type = (2.0, math.inf, 1.0)[step % 3]
        norms.append(float(strategy.clip_gradients_norm(model, opt, 0.5, norm_type=norm_type)))
        strategy.optimizer_step(opt)
        opt.zero_grad()
        ref_loss = ref(x).pow(2).mean()
        ref_loss.backward()
        ref_norms.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5, norm_type)))
        ref_opt.step()
        ref_opt.zero_grad()
        losses.append(float(strategy.all_reduce(loss.detach(), reduce_op="mean")))
        ref_losses.append(float(ref_loss))
    full = get_model_state_dict(model, options=FULL)
    return {
        "err": _max_diff(full, ref.state_dict()),
        "norms": norms,
        "ref_norms": ref_norms,
        "losses": losses,
        "ref_losses": ref_losses,
    }


# ---------------------------------------------------------------------- parity + clipping
def rank_parity(ctx: Any, strategies: tuple[str, ...]) -> dict[str, dict]:
    results = {}
    for name in strategies:
        torch.manual_seed(0)
        ref = Net()
        model = copy.deepcopy(ref)
        strategy = ctx.make_strategy(
            "fsdp",
            sharding_strategy=name,
            auto_wrap_policy={Block},
            device_mesh=_mesh_for(name, ctx.world_size),
        )
        strategy.setup_environment()
        model = strategy.setup_module(model)
        assert isinstance(model, FSDP)
        results[name] = _train_pair(ctx, strategy, model, ref, steps=3)
        strategy.teardown()
    return results


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_parity_and_clipping_every_sharding_strategy(world_size: int) -> None:
    """TRAIN-1 + CLIP-1: 3 Adam steps with clipping equal the unsharded model's, per strategy."""
    results = run_on_ranks(rank_parity, STRATEGIES, world_size=world_size)
    for name in STRATEGIES:
        per_rank = [r[name] for r in results]
        for rank, res in enumerate(per_rank):
            assert res["err"] < 1e-5, (name, rank, res["err"])
            assert res["norms"] == pytest.approx(res["ref_norms"], rel=1e-5), (name, rank)
            assert res["losses"] == pytest.approx(res["ref_losses"], rel=1e-5), (name, rank)
            assert res["norms"] == per_rank[0]["norms"], f"{name}: norm differs across ranks"
        assert min(per_rank[0]["ref_norms"]) > 0.5, "max_norm must actually clip"


def rank_nonfinite_clip(ctx: Any, name: str) -> list[bool]:
    strategy = ctx.make_strategy("fsdp", sharding_strategy=name, auto_wrap_policy={Block})
    strategy.setup_environment()
    torch.manual_seed(0)
    model = strategy.setup_module(Net())
    opt = strategy.setup_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    strategy.backward(model(_batch(0, 1)).sum(), model)
    local = [p for p in model.parameters() if p.grad is not None and p.grad.numel() > 0]
    # Replicated (NO_SHARD) gradients are equal on every rank, so poison them everywhere;
    # sharded ones only on rank 0: every rank must still raise.
    if name == "NO_SHARD" or ctx.rank == 0:
        local[0].grad.view(-1)[0] = float("inf")
    before = [p.grad.clone() for p in local]
    with pytest.raises(RuntimeError, match="non-finite"):
        strategy.clip_gradients_norm(model, opt, max_norm=1.0)
    unchanged = [torch.equal(b, p.grad) for b, p in zip(before, local, strict=True)]
    # Without the check the norm is returned and the step is the caller's business.
    norm = strategy.clip_gradients_norm(model, opt, max_norm=1.0, error_if_nonfinite=False)
    assert not torch.isfinite(norm)
    with pytest.raises(TypeError, match="sharded root"):
        strategy.clip_gradients_norm(FSDP.fsdp_modules(model)[1], opt, max_norm=1.0)
    with pytest.raises(TypeError, match="sharded root"):
        strategy.clip_gradients_norm(nn.Linear(2, 2), opt, max_norm=1.0)
    return unchanged


@pytest.mark.parametrize("name", ["FULL_SHARD", "NO_SHARD"])
def test_nonfinite_norm_raises_on_every_rank_and_leaves_gradients(name: str) -> None:
    """CLIP-1: a non-finite norm raises RuntimeError everywhere; gradients are untouched."""
    for unchanged in run_on_ranks(rank_nonfinite_clip, name, world_size=2):
        assert all(unchanged)


# ---------------------------------------------------------------------- no_backward_sync
def _sync_flags(model: nn.Module) -> list[bool]:
    return [unit._sync_gradients for unit in FSDP.fsdp_modules(model)]


def rank_no_backward_sync(ctx: Any) -> dict:
    torch.manual_seed(0)
    ref = Net()
    strategy = ctx.make_strategy("fsdp", auto_wrap_policy={Block})
    strategy.setup_environment()
    model = strategy.setup_module(copy.deepcopy(ref))
    opt = strategy.setup_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2))
    before = _sync_flags(model)
    with strategy.no_backward_sync(model, enabled=False):
        assert _sync_flags(model) == before
    with pytest.raises(KeyError, match="boom"):
        with strategy.no_backward_sync(model, enabled=True):
            assert not any(_sync_flags(model))
            raise KeyError("boom")
    after_raise = _sync_flags(model)
    with pytest.raises(TypeError, match="sharded root"):
        with strategy.no_backward_sync(FSDP.fsdp_modules(model)[1], enabled=True):
            pass
    with pytest.raises(TypeError, match="sharded root"):
        with strategy.no_backward_sync(nn.Linear(2, 2), enabled=True):
            pass
    # Accumulate 2 micro-batches without sync, then 1 synced: equals one step on all data.
    x = _batch(0, ctx.world_size, rows=3 * MICRO)
    mine = x.view(ctx.world_size, 3, MICRO, 5)[ctx.rank]
    for i in range(3):
        with strategy.no_backward_sync(model, enabled=i < 2):
            strategy.backward(model(mine[i]).pow(2).mean() / 3, model)
    strategy.optimizer_step(opt)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    ref(x).pow(2).mean().backward()
    ref_opt.step()
    err = _max_diff(get_model_state_dict(model, options=FULL), ref.state_dict())
    return {"before": before, "after_raise": after_raise, "err": err}


def test_no_backward_sync_restores_and_accumulates() -> None:
    """SYNC-1: no-op when disabled; restored after an exception; TypeError off-root; parity."""
    for res in run_on_ranks(rank_no_backward_sync, world_size=2):
        assert res["before"] == res["after_raise"] and all(res["before"])
        assert res["err"] < 1e-5


# ---------------------------------------------------------------------- meta-device init
def _resets(model: nn.Module) -> dict[str, int]:
    return {n: m.resets for n, m in model.named_modules() if isinstance(m, _Seeded)}


def rank_meta_init(ctx: Any, use_orig_params: bool) -> dict:
    out = {}
    states = {}
    for empty in (False, True):
        strategy = ctx.make_strategy(
            "fsdp", auto_wrap_policy={SeededBlock}, extra={"use_orig_params": use_orig_params}
        )
        strategy.setup_environment()
        with strategy.module_init_context(empty_init=empty):
            model = TiedNet()
        assert all(p.is_meta for p in model.parameters()) == empty
        model = strategy.setup_module(model)
        inner = model.module
        assert not any(t.is_meta for t in (*model.parameters(), *model.buffers()))
        out[f"resets_{empty}"] = _resets(model)
        out[f"tied_{empty}"] = inner.head.weight is inner.emb.weight or not use_orig_params
        out[f"offset_{empty}"] = inner.emb.offset.tolist()
        states[empty] = get_model_state_dict(model, options=FULL)
        # Tied weights stay tied through a step.
        opt = strategy.setup_optimizer(torch.optim.SGD(model.parameters(), lr=0.5))
        strategy.backward(model(torch.tensor([[1, 2, 3]])).sum(), model)
        strategy.optimizer_step(opt)
        after = get_model_state_dict(model, options=FULL)
        out[f"tied_after_step_{empty}"] = torch.equal(after["emb.weight"], after["head.weight"])
    out["equal"] = sorted(states[False]) == sorted(states[True]) and all(
        torch.equal(states[False][k], states[True][k]) for k in states[False]
    )
    out["keys"] = sorted(states[True])
    return out


@pytest.mark.parametrize("use_orig_params", [True, False])
def test_meta_init_equals_eager_init(use_orig_params: bool) -> None:
    """API-3 + INIT-1: reset_parameters once per module, same values, ties and buffers kept."""
    for res in run_on_ranks(rank_meta_init, use_orig_params, world_size=2):
        assert res["equal"], res["keys"]
        assert "emb.scale" in res["keys"] and "emb.offset" not in res["keys"]
        for empty in (False, True):
            assert set(res[f"resets_{empty}"].values()) == {1}, res[f"resets_{empty}"]
            assert res[f"tied_{empty}"] and res[f"tied_after_step_{empty}"]
            assert res[f"offset_{empty}"] == [0.25] * 6


# ---------------------------------------------------------------------- wrapping + AC
def rank_wrapping_and_checkpointing(ctx: Any) -> dict:
    out: dict[str, Any] = {}
    # AC-1/AC-2: nested Blocks, only the outermost is checkpointed; numbers unchanged.
    torch.manual_seed(0)
    ref = Net(inner=True)
    strategy = ctx.make_strategy(
        "fsdp", auto_wrap_policy={Block}, activation_checkpointing_policy={Block}
    )
    strategy.setup_environment()
    model = strategy.setup_module(copy.deepcopy(ref))
    wrappers = [m for m in model.modules() if isinstance(m, CheckpointWrapper)]
    out["n_wrappers"] = len(wrappers)
    out["nested"] = any(
        isinstance(m, CheckpointWrapper) for w in wrappers for m in list(w.modules())[1:]
    )
    out["units"] = len(FSDP.fsdp_modules(model))
    out["ac_err"] = _train_pair(ctx, strategy, model, ref, steps=2)["err"]
    # Already checkpointed: warn and do nothing.
    pre = Net()
    pre.blocks[0] = checkpoint_wrapper(pre.blocks[0])
    strategy = ctx.make_strategy("fsdp", activation_checkpointing_policy={Block})
    strategy.setup_environment()
    with pytest.warns(UserWarning, match="already contains activation-checkpointed"):
        model = strategy.setup_module(pre)
    out["pre_wrappers"] = sum(isinstance(m, CheckpointWrapper) for m in model.modules())
    # WRAP-2: a model the user already wrapped keeps its units; the policy is ignored.
    user = Net()
    for i, block in enumerate(user.blocks):
        user.blocks[i] = FSDP(block, device_id=strategy.root_device, use_orig_params=True)
    strategy = ctx.make_strategy("fsdp", auto_wrap_policy={nn.Linear})
    strategy.setup_environment()
    with pytest.warns(UserWarning, match="auto_wrap_policy is ignored"):
        model = strategy.setup_module(user)
    units = FSDP.fsdp_modules(model)
    out["user_units"] = len(units)
    out["linear_units"] = sum(isinstance(u.module, nn.Linear) for u in units)
    again = strategy.setup_module(model)  # an FSDP root is returned as it is
    out["same_root"] = again is model
    return out


def test_wrapping_and_activation_checkpointing() -> None:
    """WRAP-1/2, AC-1/2: outermost checkpointing only, no re-wrapping, numbers unchanged."""
    for res in run_on_ranks(rank_wrapping_and_checkpointing, world_size=2):
        assert res["n_wrappers"] == 2 and not res["nested"]
        assert res["units"] == 5  # root + 2 outer + 2 inner Blocks
        assert res["ac_err"] < 1e-5
        assert res["pre_wrappers"] == 1
        assert res["user_units"] == 3 and res["linear_units"] == 0
        assert res["same_root"]


# ---------------------------------------------------------------------- checkpoint delegation
def rank_checkpoint_round_trip(ctx: Any, state_dict_type: str) -> dict:
    """Save through the strategy, load into fresh objects, compare with torch's readers."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    def build() -> tuple[Any, nn.Module, torch.optim.Optimizer]:
        strategy = ctx.make_strategy(
            "fsdp", auto_wrap_policy={Block}, state_dict_type=state_dict_type
        )
        strategy.setup_environment()
        torch.manual_seed(ctx.rank)  # different on purpose: loading must overwrite
        model = strategy.setup_module(Net())
        return strategy, model, strategy.setup_optimizer(torch.optim.Adam(model.parameters()))

    strategy, model, opt = build()
    strategy.backward(model(_batch(0, 1)).sum(), model)
    strategy.optimizer_step(opt)
    path = f"{ctx.tmp_dir}/ckpt-{state_dict_type}"
    strategy.save_checkpoint(path, {"model": model, "optimizer": opt, "step": 3})
    strategy2, model2, opt2 = build()
    state = {"model": model2, "optimizer": opt2, "step": 0}
    rest = strategy2.load_checkpoint(path, state)
    saved = get_model_state_dict(model, options=FULL)
    loaded = get_model_state_dict(model2, options=FULL)
    osaved = get_optimizer_state_dict(model, opt, options=FULL)["state"]
    oloaded = get_optimizer_state_dict(model2, opt2, options=FULL)["state"]
    return {
        "model": all(torch.equal(saved[k], loaded[k]) for k in saved),
        "optim": sorted(osaved) == sorted(oloaded)
        and all(torch.equal(osaved[k]["exp_avg"], oloaded[k]["exp_avg"]) for k in osaved),
        "step": state["step"],
        "rest": rest,
    }


@pytest.mark.parametrize("state_dict_type", ["full", "sharded"])
def test_checkpoint_round_trip_through_the_strategy(state_dict_type: str) -> None:
    """The strategy's save/load delegate to reference_impl.checkpoint (no segfault on CPU)."""
    for res in run_on_ranks(rank_checkpoint_round_trip, state_dict_type, world_size=2):
        assert res["model"] and res["optim"]
        assert res["step"] == 3 and res["rest"] == {}
