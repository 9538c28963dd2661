"""Regression examples: fixed scenarios where sharded strategies have shipped bugs.

Suite tests add them with ``@example(...)`` so they run in every Hypothesis profile, in
addition to the drawn examples (derandomized ``ci`` draws may miss a configuration). Each
scenario runs at world size 2; a checkpoint plan saves and loads at the world sizes it names
(a session without them reports the example as ``environment``).
"""

from __future__ import annotations

import dataclasses

from suites.lib.shared.checkpoint_specs import CkptPlan
from suites.lib.shared.models import BlockSpec, ModelSpec
from suites.lib.shared.specs import (
    ACSpec,
    FSDPConfig,
    MPConfig,
    OptimSpec,
    Scenario,
    TrainPlan,
    WrapSpec,
)

__all__ = [
    "AC_BLOCKS",
    "CLIP_FSDP2",
    "CLIP_NO_SHARD",
    "FULL_1X2_TO_2X2",
    "INIT_FSDP2",
    "INIT_NESTED",
    "INIT_ZOO",
    "SESSION_16_MIXED_CLIP",
    "SHARDED_1X2_TO_2X2",
    "SYNC_NESTED",
    "SYNC_TIED_MIXED",
    "TRAIN_ZOO",
    "WRAP_MHA_MIXED",
]

_MODEL = ModelSpec(
    hidden=5,
    blocks=(BlockSpec(ffn=3), BlockSpec("NestedBlock", ffn=2, inner=1)),
    vocab=7,
    out=7,
    tied=True,
    seed=3,
)
_NESTED = WrapSpec("classes", ("Block", "NestedBlock"))
#: NO_SHARD clipping that sums the replicated gradients of every rank (norm x sqrt(world))
CLIP_NO_SHARD = Scenario(
    2, _MODEL, FSDPConfig("NO_SHARD", _NESTED), OptimSpec("sgd"), TrainPlan(1, clip=0.05)
)
#: FSDP2 clipping that uses the local shard's norm
CLIP_FSDP2 = Scenario(2, _MODEL, MPConfig(2, 1), OptimSpec("sgd"), TrainPlan(1, clip=0.05))
#: meta-device init of nested wrap units (reset_parameters only on each unit's root)
INIT_NESTED = Scenario(2, _MODEL, FSDPConfig("FULL_SHARD", _NESTED), empty_init=True)
INIT_FSDP2 = Scenario(
    2, _MODEL, MPConfig(2, 1, fsdp_classes=("Block", "NestedBlock")), empty_init=True
)
#: accumulation under no_backward_sync on nested units
SYNC_NESTED = Scenario(
    2, _MODEL, FSDPConfig("FULL_SHARD", _NESTED), OptimSpec("sgd"), TrainPlan(1, micro_batches=2)
)
#: accumulation on a NO_SHARD unit with a tied (shared) parameter under bf16-mixed: torch's
#: FSDP1 assigned the low-precision accumulated gradient to the shared float32 parameter in
#: the next forward and failed ("gradient with dtype BFloat16 ... grad_dtype Float")
SYNC_TIED_MIXED = Scenario(
    2,
    ModelSpec(
        hidden=6,
        blocks=(BlockSpec(ffn=2), BlockSpec(ffn=1)),
        vocab=6,
        out=6,
        tied=True,
        frozen=tuple(f"blocks.{i}.fc{j}.weight" for i in (0, 1) for j in (1, 2)),
        seed=853,
    ),
    FSDPConfig("NO_SHARD", WrapSpec("custom_policy", ("Block",)), precision="bf16-mixed"),
    OptimSpec("adam", lr=0.01),
    TrainPlan(steps=2, micro_batches=2, batch_size=3, data_seed=7408),
)
#: activation checkpointing on nested wrap units (applied twice: wrappers inside wrappers)
AC_BLOCKS = Scenario(
    2,
    _MODEL,
    FSDPConfig("FULL_SHARD", _NESTED, ACSpec("classes", ("Block",))),
    OptimSpec("sgd"),
    TrainPlan(1),
)
#: the transformer-shaped zoo under FSDP1 with the blocks as units: a parameter on the root
#: module (no wrap policy selects it: FairScale's auto_wrap left such parameters out of every
#: unit, never all-reduced, facebookresearch/fairscale#791), a Block called twice in forward
#: as its own unit (FairScale lost one use's gradient, facebookresearch/fairscale#780) and
#: rotary tables that meta-device init must recompute (pytorch/torchtitan#4783)
_ZOO = ModelSpec(
    hidden=6,
    blocks=(
        BlockSpec("AttentionBlock", ffn=4, heads=2, tokens=3),
        BlockSpec("AttentionBlock", ffn=2, attention="mha", heads=1, tokens=2),
    ),
    vocab=5,
    out=5,
    tied=True,
    root_param=True,
    shared=True,
    seed=21,
)
_ZOO_UNITS = WrapSpec("classes", ("AttentionBlock", "Block"))
#: (SGD: Adam's first step moves each element by lr * sign(gradient), which a rank's own
#: gradient often shares with the averaged one)
TRAIN_ZOO = Scenario(2, _ZOO, FSDPConfig("FULL_SHARD", _ZOO_UNITS), OptimSpec("sgd"), TrainPlan(1))
INIT_ZOO = Scenario(2, _ZOO, FSDPConfig("FULL_SHARD", _ZOO_UNITS), empty_init=True)

#: a size-based policy under bf16-mixed on a model with nn.MultiheadAttention: torch's FSDP1
#: recursed into the attention (a forced leaf of the size policy) and wrapped its out_proj,
#: which the attention never calls, so under NO_SHARD its gradient was never all-reduced and
#: the ranks diverged (see the reference's [Note: callable policies under mixed precision])
WRAP_MHA_MIXED = Scenario(
    2,
    ModelSpec(
        hidden=6,
        blocks=(
            BlockSpec("AttentionBlock", ffn=1, norm=False, attention="mha", heads=2, tokens=3),
        ),
        in_features=4,
        out=1,
        seed=13293,
    ),
    FSDPConfig("NO_SHARD", WrapSpec("size", min_num_params=7), precision="bf16-mixed"),
    OptimSpec("adam", lr=0.003),
    TrainPlan(1, data_seed=231),
)

#: a checkpoint saved at data-parallel 1 x tensor-parallel 2 and loaded at 2 x 2, with sizes
#: that divide neither (hidden=3, ffn=2, tied, Scale): on the 2 x 2 mesh FSDP2 shards fc1's
#: tensor-parallel row over the data-parallel dim (``_StridedShard(0, sf=2)``, 1 row and 0
#: rows), and torch's full-state loader failed to scatter it (bare AssertionError in
#: ``_StridedShard._shard_tensor``; issue 13). The sharded variant goes through the offline
#: conversion, the full load, a sharded save on the 2 x 2 mesh and its load.
_UNEVEN = ModelSpec(hidden=3, blocks=(BlockSpec(ffn=2),), vocab=4, out=4, tied=True, seed=11)
FULL_1X2_TO_2X2 = CkptPlan(
    save=Scenario(2, _UNEVEN, MPConfig(1, 2, "mlp"), OptimSpec("adam"), TrainPlan(1)),
    fmt="full",
    load=Scenario(
        4,
        dataclasses.replace(_UNEVEN, seed=12),
        MPConfig(2, 2, "mlp"),
        OptimSpec("adam", lr=0.2),
        TrainPlan(1),
    ),
)
SHARDED_1X2_TO_2X2 = dataclasses.replace(FULL_1X2_TO_2X2, fmt="sharded")

#: a training session under 16-mixed that clips while a trainable parameter is in no
#: optimizer yet (the session's held-back one): the grad scaler unscaled only the
#: optimizer's gradients, the held-back one stayed 65536 times too large and dominated the
#: clip norm, and every gradient was clipped to about 1/500 of the plain model's (dev seed 1;
#: see the reference's [Note: unscaling what no optimizer holds]). For the session check's
#: short session (it clips in its first warm-up step, before the group is added).
SESSION_16_MIXED_CLIP = Scenario(
    2,
    _MODEL,
    FSDPConfig("FULL_SHARD", _NESTED, precision="16-mixed"),
    OptimSpec("sgd", lr=0.05, momentum=0.9, eps=1e-4),
    TrainPlan(steps=0, batch_size=2, data_seed=0, loss_scale=1 / 256),
)
