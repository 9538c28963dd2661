"""Regression examples: fixed scenarios where sharded strategies have shipped bugs.

Suite tests add them with ``@example(...)`` so they run in every Hypothesis profile, in
addition to the drawn examples (derandomized ``ci`` draws may miss a configuration). Each
runs at world size 2.
"""

from __future__ import annotations

from suites.models import BlockSpec, ModelSpec
from suites.specs import ACSpec, FSDPConfig, MPConfig, OptimSpec, Scenario, TrainPlan, WrapSpec

__all__ = ["AC_BLOCKS", "CLIP_FSDP2", "CLIP_NO_SHARD", "INIT_FSDP2", "INIT_NESTED", "SYNC_NESTED"]

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
#: activation checkpointing on nested wrap units (applied twice: wrappers inside wrappers)
AC_BLOCKS = Scenario(
    2,
    _MODEL,
    FSDPConfig("FULL_SHARD", _NESTED, ACSpec("classes", ("Block",))),
    OptimSpec("sgd"),
    TrainPlan(1),
)
