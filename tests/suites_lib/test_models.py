"""The model zoo: deterministic, meta-init equal to eager init, ties and frozen flags."""

from __future__ import annotations

import pytest
import torch

from suites.lib.shared.axes import scenario_axes
from suites.lib.shared.models import (
    BlockSpec,
    ModelSpec,
    build_model,
    clean_name,
    iter_param_owners,
    make_batch,
    module_class,
)
from suites.lib.shared.specs import FSDPConfig, Scenario

SPEC = ModelSpec(
    hidden=5,
    blocks=(BlockSpec("Block", ffn=3), BlockSpec("NestedBlock", ffn=1, norm=False, inner=2)),
    vocab=7,
    out=7,
    tied=True,
    frozen=("blocks.0.fc1.bias",),
    seed=11,
)


def test_build_is_deterministic_and_seed_dependent() -> None:
    a, b = build_model(SPEC).state_dict(), build_model(SPEC).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = build_model(ModelSpec(**{**SPEC.__dict__, "seed": 12})).state_dict()
    assert not torch.equal(a["blocks.0.fc1.weight"], other["blocks.0.fc1.weight"])


def test_meta_init_then_reset_in_any_order_equals_eager() -> None:
    eager = build_model(SPEC)
    meta = build_model(SPEC, "meta")
    meta.to_empty(device="cpu")
    for _, module in reversed(list(iter_param_owners(meta))):  # bottom-up, as FSDP1 does
        module.reset_parameters()
    meta.tie_weights()
    expected = eager.state_dict()
    assert set(meta.state_dict()) == set(expected)
    for key, value in meta.state_dict().items():
        assert torch.equal(value, expected[key]), key
    assert meta.scale.offset.tolist() == eager.scale.offset.tolist()  # non-persistent too


def test_tied_and_frozen() -> None:
    model = build_model(SPEC)
    assert model.head.weight is model.embed.weight
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen == ["blocks.0.fc1.bias"]
    assert "scale.offset" not in model.state_dict() and "scale.scale" in model.state_dict()
    assert model.scale.gate.numel() == 1


def test_forward_and_batches() -> None:
    model = build_model(SPEC)
    x, y = make_batch(SPEC, 3, step=1, micro=0, dp_rank=2, batch_size=4)
    assert x.dtype == torch.int64 and x.shape == (4,) and y.shape == (4, 7)
    assert model(x).shape == (4, 7)
    x2, _ = make_batch(SPEC, 3, step=1, micro=0, dp_rank=2, batch_size=4)
    x3, _ = make_batch(SPEC, 3, step=1, micro=0, dp_rank=1, batch_size=4)
    assert torch.equal(x, x2) and not torch.equal(x, x3)


def test_float_input_model() -> None:
    spec = ModelSpec(hidden=3, in_features=4, out=2, scale=False)
    x, y = make_batch(spec, 0, 0, 0, 0, 2)
    assert x.dtype == torch.float32 and build_model(spec)(x).shape == y.shape


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match=r"tied=True.*out=vocab"):
        ModelSpec(vocab=0, tied=True)
    with pytest.raises(ValueError, match="'Mlp' is not a zoo block"):
        ModelSpec(blocks=(BlockSpec("Mlp"),))
    with pytest.raises(ValueError, match="'Nope' is not in the zoo"):
        module_class("Nope")


def test_clean_name_strips_wrapper_segments() -> None:
    name = (
        "_fsdp_wrapped_module.blocks.0._fsdp_wrapped_module._checkpoint_wrapped_module.fc1.weight"
    )
    assert clean_name(name) == "blocks.0.fc1.weight"
    assert clean_name("_orig_mod.head.bias") == "head.bias"


def test_init_does_not_depend_on_the_default_dtype() -> None:
    expected = build_model(SPEC).state_dict()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        low = build_model(SPEC).state_dict()
    finally:
        torch.set_default_dtype(previous)
    for key, value in low.items():
        assert value.dtype == torch.bfloat16
        assert torch.equal(value, expected[key].to(torch.bfloat16)), key


# --- the transformer-shaped zoo: attention, rotary buffers, root parameter, shared module --

ZOO = ModelSpec(
    hidden=6,
    blocks=(
        BlockSpec("AttentionBlock", ffn=4, heads=2, tokens=3),
        BlockSpec("AttentionBlock", ffn=2, attention="mha", heads=2, tokens=2, norm=False),
    ),
    vocab=5,
    out=5,
    tied=True,
    root_param=True,
    shared=True,
    seed=4,
)


def _materialized(spec: ModelSpec) -> torch.nn.Module:
    model = build_model(spec, "meta")
    model.to_empty(device="cpu")
    for _, module in reversed(list(iter_param_owners(model))):  # bottom-up, as FSDP1 does
        module.reset_parameters()
    model.tie_weights()
    return model


def test_attention_zoo_meta_init_equals_eager_buffers_included() -> None:
    eager, meta = build_model(ZOO), _materialized(ZOO)
    assert set(meta.state_dict()) == set(eager.state_dict())
    for key, value in meta.state_dict().items():
        assert torch.equal(value, eager.state_dict()[key]), key
    buffers = dict(eager.named_buffers())
    for key, value in meta.named_buffers():
        assert torch.equal(value, buffers[key]), key
    x, _ = make_batch(ZOO, 0, 0, 0, 0, 3)
    assert torch.equal(meta(x), eager(x))


def test_rotary_tables_are_non_persistent_and_recomputed() -> None:
    model = _materialized(ZOO)
    names = [n for n, _ in model.named_buffers() if ".rotary." in n]
    assert names == [
        "blocks.0.attn.rotary.cos",
        "blocks.0.attn.rotary.sin",
        "blocks.1.attn.rotary.cos",
        "blocks.1.attn.rotary.sin",
    ]
    assert not set(names) & set(model.state_dict())
    rotary = model.blocks[0].attn.rotary
    positions = torch.arange(1, 4, dtype=torch.float32)[:, None]
    assert torch.allclose(rotary.cos, positions.cos()) and torch.allclose(
        rotary.sin, positions.sin()
    )
    with torch.no_grad():
        rotary.cos.fill_(7.0)
    rotary.reset_parameters()
    assert torch.allclose(rotary.cos, positions.cos())


def test_root_parameter_and_shared_module_appear_once() -> None:
    model = build_model(ZOO)
    keys = list(model.state_dict())
    assert keys.count("gain") == 1 and "gain" in dict(model.named_parameters(recurse=False))
    assert sum(k.startswith("shared.") for k in keys) == 6  # norm, fc1, fc2: weight + bias
    calls = []
    model.shared.register_forward_hook(lambda *_: calls.append(1))
    x, y = make_batch(ZOO, 0, 0, 0, 0, 2)
    torch.nn.functional.mse_loss(model(x), y).backward()
    assert len(calls) == 2  # one module, called twice per forward
    assert model.gain.grad is not None and model.shared.fc1.weight.grad is not None


@pytest.mark.parametrize("attention", ["hand", "mha"])
def test_attention_keeps_samples_independent(attention: str) -> None:
    spec = ModelSpec(
        hidden=8, blocks=(BlockSpec("AttentionBlock", attention=attention, heads=2, tokens=4),)
    )
    model = build_model(spec)
    x, _ = make_batch(spec, 1, 0, 0, 0, 5)
    whole = model(x)
    for i in range(5):
        assert torch.allclose(model(x[i : i + 1]), whole[i : i + 1], atol=1e-6)
    swapped = x.clone()
    swapped[0] = x[1]
    assert torch.allclose(model(swapped)[1:], whole[1:], atol=1e-6)


def test_attention_spec_validation() -> None:
    with pytest.raises(ValueError, match=r"tokens=4.*divisors of hidden"):
        ModelSpec(hidden=6, blocks=(BlockSpec("AttentionBlock", tokens=4),))
    with pytest.raises(ValueError, match="attention='flash' is unknown"):
        ModelSpec(blocks=(BlockSpec("AttentionBlock", attention="flash"),))


# --- running statistics: a BatchNorm with two float buffers and an int64 counter ----------

NORM = ModelSpec(hidden=6, blocks=(BlockSpec(ffn=4),), running_stats=True, seed=8)
STATS = ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked")


def test_batchnorm_holds_float_statistics_and_an_integer_counter_meta_init_included() -> None:
    eager, meta = build_model(NORM), _materialized(NORM)
    state = eager.state_dict()
    assert [state[k].dtype for k in STATS] == [torch.float32, torch.float32, torch.int64]
    assert state["bn.running_mean"].shape == (2,)  # 6 features: 2 channels of 3 positions
    assert int(state["bn.num_batches_tracked"]) > 0  # seeded, as if fine-tuning
    assert not torch.equal(state["bn.running_mean"], torch.zeros(2))
    assert not torch.equal(state["bn.running_var"], torch.ones(2))
    for key, value in meta.state_dict().items():
        assert torch.equal(value, state[key]), key
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        low = build_model(NORM).state_dict()
    finally:
        torch.set_default_dtype(previous)
    assert [low[k].dtype for k in STATS] == [torch.bfloat16, torch.bfloat16, torch.int64]
    assert torch.equal(low["bn.num_batches_tracked"], state["bn.num_batches_tracked"])


def test_batchnorm_updates_every_statistic_in_training_only() -> None:
    model = build_model(NORM)
    before = {k: v.clone() for k, v in model.state_dict().items() if k in STATS}
    x, _ = make_batch(NORM, 0, 0, 0, 0, 1)  # one sample: still 3 values per channel
    model(x)
    after = model.state_dict()
    assert int(after["bn.num_batches_tracked"]) == int(before["bn.num_batches_tracked"]) + 1
    for key in STATS[:2]:
        assert not torch.equal(after[key], before[key]), key
    model.eval()
    frozen = {k: v.clone() for k, v in model.state_dict().items() if k in STATS}
    model(x)
    assert all(torch.equal(model.state_dict()[k], frozen[k]) for k in STATS)


def test_running_statistics_models_share_inputs_across_data_parallel_ranks() -> None:
    x0, y0 = make_batch(NORM, 3, step=1, micro=0, dp_rank=0, batch_size=2)
    x1, y1 = make_batch(NORM, 3, step=1, micro=0, dp_rank=1, batch_size=2)
    assert torch.equal(x0, x1) and not torch.equal(y0, y1)
    x2, _ = make_batch(NORM, 3, step=1, micro=1, dp_rank=0, batch_size=2)
    assert not torch.equal(x0, x2)
    assert "running statistics" in scenario_axes(Scenario(1, NORM, FSDPConfig()))["model"]
