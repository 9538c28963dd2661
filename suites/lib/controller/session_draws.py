"""What the training-session check (CONTRACT.md TRAIN-4) draws, and what its sessions ran.

:func:`session_scenarios` draws a session's starting scenario of one family from what the
strategy takes: world size, sharding strategy (hybrid meshes with more than one replica),
wrap and activation-checkpointing policies (fsdp), the ``(dp, tp)`` mesh and its plan
(model_parallel), precision (every one the family takes), optimizer, the zoo model (tied
embeddings, frozen parameters, nested blocks, buffers) and eager or meta-device init.
:func:`covering_scenario` is one fixed, demanding scenario per family for the scripted
session that runs every rule by construction. :data:`COUNTS` counts the rules run per
family (the test prints it and, under the ``ci`` profile, asserts every rule ran).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import strategies as st

from suites.lib.controller.scenarios import FSDP_PRECISIONS, MP_PRECISIONS, scenarios
from suites.lib.shared.models import BlockSpec, ModelSpec
from suites.lib.shared.specs import (
    ACSpec,
    FSDP2Config,
    FSDPConfig,
    MPConfig,
    OptimSpec,
    Scenario,
    TrainPlan,
    WrapSpec,
)

__all__ = [
    "COUNTS",
    "PRECISIONS",
    "RULES",
    "STEPS",
    "covering_scenario",
    "session_scenarios",
    "session_start",
]

#: (micro-batches, clip max_norm): accumulation and clipping first
STEPS = st.tuples(st.sampled_from((2, 1, 3)), st.sampled_from((0.5, None)))

#: the precisions each family's sessions draw: every one the family takes. The twin trains
#: fp32 (from values rounded to the low dtype under ``*-true``, with the loss scaled as the
#: ranks scale it under ``16-mixed``) and is compared within the tolerance table's row of the
#: loosest precision the session ran, as TRAIN-1 is; ``16-true`` trains with SGD
PRECISIONS = {"fsdp": FSDP_PRECISIONS, "model_parallel": MP_PRECISIONS, "fsdp2": FSDP_PRECISIONS}

#: every rule of the session machine
RULES = (
    "train",
    "freeze",
    "unfreeze",
    "add_group",
    "save",
    "save_mid_step",
    "load_live",
    "load_fresh",
    "convert",
    "load_other_family",
    "rebuild",
)

#: (family, rule) -> times run; (family, "scripted") / (family, "drawn") sessions, and
#: (family, "precision <p>") the drawn sessions of each precision
COUNTS: Counter[tuple[str, str]] = Counter()


def _replicated(world: int) -> st.SearchStrategy[tuple[int, int]]:
    """Hybrid ``(replicate, shard)`` meshes of ``world`` with more than one replica."""
    return st.sampled_from([(r, world // r) for r in range(2, world + 1) if world % r == 0])


@st.composite
def session_scenarios(draw: st.DrawFn, family: str) -> Scenario:
    """A scenario of ``family`` whose optimizer has state (momentum for SGD)."""
    plan = TrainPlan(
        steps=0, batch_size=draw(st.integers(1, 3)), data_seed=draw(st.integers(0, 99))
    )
    precision = draw(st.sampled_from(PRECISIONS[family]))
    scenario = draw(
        scenarios(
            family,
            plan=st.just(plan),
            precisions=(precision,),
            # fp16 Adam's second moment underflows (tolerances.py): 16-true trains with SGD
            optimizers=("sgd",) if precision == "16-true" else ("adamw", "adam", "sgd"),
            ac=family in ("fsdp", "fsdp2") and draw(st.booleans()),
            empty_init=None,
        )
    )
    strategy = scenario.strategy
    if isinstance(strategy, FSDPConfig) and strategy.device_mesh is not None:
        mesh = draw(_replicated(scenario.world_size))
        scenario = dataclasses.replace(
            scenario, strategy=dataclasses.replace(strategy, device_mesh=mesh)
        )
    return dataclasses.replace(scenario, optim=dataclasses.replace(scenario.optim, momentum=0.9))


def session_start(scenario: Scenario) -> Scenario:
    """A configuration of the covering candidates as a session's start: the session's own
    plan (no steps of its own; the loss scaled under ``16-mixed``) and an optimizer with
    momentum, so that SGD has state too. The axes are those of ``scenario``."""
    plan = TrainPlan(
        steps=0,
        batch_size=2,
        data_seed=scenario.plan.data_seed,
        loss_scale=1 / 256 if scenario.precision == "16-mixed" else 1.0,
    )
    optim = dataclasses.replace(scenario.optim, momentum=0.9)
    return dataclasses.replace(scenario, plan=plan, optim=optim)


#: the covering sessions' model: a plain and a nested block, norms, the Scale module's
#: buffers, an embedding tied to the head
_COVERING_MODEL = ModelSpec(
    hidden=6,
    blocks=(BlockSpec(kind="Block", ffn=4, norm=True), BlockSpec("NestedBlock", 2, False, 1)),
    vocab=5,
    in_features=3,
    out=5,
    tied=True,
    scale=True,
    seed=11,
)


def covering_scenario(family: str, world: int = 4) -> Scenario:
    """The scripted session's scenario of ``family``. At world size 4: fsdp HYBRID_SHARD on
    a (2, 2) mesh, Block units, checkpointed Blocks, fp32 Adam; model_parallel on a (2, 2)
    mesh with the MLP plan, bf16-mixed AdamW; fsdp2 Block units resharded to 2 ranks after
    forward, checkpointed Blocks, bf16-mixed AdamW. At 2: fsdp SHARD_GRAD_OP with Block
    units; model_parallel tensor parallel only (1, 2); fsdp2 on a (2, 1) HSDP mesh (two
    replicas), Block and NestedBlock units kept unsharded after forward, fp32."""
    plan = TrainPlan(steps=0, batch_size=2, data_seed=5)
    if world == 2:
        small: FSDPConfig | MPConfig | FSDP2Config
        if family == "fsdp":
            small = FSDPConfig("SHARD_GRAD_OP", wrap=WrapSpec("classes", ("Block",)))
        elif family == "fsdp2":
            small = FSDP2Config(
                wrap=WrapSpec("classes", ("Block", "NestedBlock")),
                reshard_after_forward=False,
                device_mesh=(2, 1),
            )
        else:
            small = MPConfig(1, 2, tp_plan="mlp", fsdp_classes=("Block", "NestedBlock"))
        return dataclasses.replace(covering_scenario(family), world_size=2, strategy=small)
    if family == "fsdp2":
        blocks = FSDP2Config(
            wrap=WrapSpec("classes", ("Block",)),
            reshard_after_forward=2,
            ac=ACSpec("classes", ("Block",)),
            precision="bf16-mixed",
        )
        optim = OptimSpec("adamw", lr=0.01, groups="by_kind", weight_decay=0.1)
        return Scenario(4, _COVERING_MODEL, blocks, optim, plan)
    if family == "fsdp":
        config: FSDPConfig | MPConfig = FSDPConfig(
            "HYBRID_SHARD",
            wrap=WrapSpec("module_wrap_policy", ("Block",)),
            ac=ACSpec("classes", ("Block",)),
            device_mesh=(2, 2),
        )
        optim = OptimSpec("adam", lr=0.01, groups="by_kind")
    else:
        config = MPConfig(2, 2, tp_plan="mlp", fsdp_classes=("Block",), precision="bf16-mixed")
        optim = OptimSpec("adamw", lr=0.01, groups="by_depth", weight_decay=0.1)
    return Scenario(4, _COVERING_MODEL, config, optim, plan)
