"""Examples that put "each instance of those classes" to the test (WRAP-1, FSDP2-1, AC-1).

A policy given classes (a set, a ``ModuleWrapPolicy``) selects every instance of them: an
instance of a subclass of a listed class too, and no module of another class that merely
shares a listed class's name. :data:`LOOKALIKE_MODEL` holds all three beside one another: a
``Block``, a ``ScaledBlock`` (a subclass of ``Block``) and a ``ForeignBlock`` (another
module's class named ``Block``), and every example here lists ``Block``. A strategy that
selects by exact type leaves the subclass's instance out; one that selects by class name
takes the other module's ``Block`` in.

The checks of those clauses draw such models too (``lookalikes=None`` of
:func:`~suites.lib.controller.scenarios.scenarios`); these explicit examples reach them in
every profile, the derandomized ``ci`` included. :data:`AC_NESTED` puts AC-1's "never one
checkpoint wrapper inside another" to the test, which no drawn checkpointing policy does (they
never select a module inside another they select). Each runs at world size 2, one SGD step.
"""

from __future__ import annotations

from suites.lib.shared.models import BlockSpec, ModelSpec
from suites.lib.shared.specs import (
    ACSpec,
    FSDP2Config,
    FSDPConfig,
    OptimSpec,
    Scenario,
    TrainPlan,
    WrapSpec,
)

__all__ = [
    "AC_LOOKALIKES",
    "AC_NESTED",
    "FSDP2_LOOKALIKES",
    "LOOKALIKE_MODEL",
    "WRAP_LOOKALIKES",
]

#: a Block, a Block subclass and another module's Block, side by side
LOOKALIKE_MODEL = ModelSpec(
    hidden=4,
    blocks=(BlockSpec(ffn=3), BlockSpec("ScaledBlock", ffn=2), BlockSpec("ForeignBlock", ffn=2)),
    seed=5,
)
_BLOCK = ("Block",)


def _scenario(config: FSDPConfig | FSDP2Config, model: ModelSpec = LOOKALIKE_MODEL) -> Scenario:
    return Scenario(2, model, config, OptimSpec("sgd"), TrainPlan(steps=1))


#: WRAP-1: FSDP1 units of a set of classes and of a ``ModuleWrapPolicy``
WRAP_LOOKALIKES = (
    _scenario(FSDPConfig("FULL_SHARD", WrapSpec("classes", _BLOCK))),
    _scenario(FSDPConfig("SHARD_GRAD_OP", WrapSpec("module_wrap_policy", _BLOCK))),
)
#: FSDP2-1: ``fully_shard`` units of a set of classes, and of a ``ModuleWrapPolicy``: also
#: FSDP2-1's "an FSDP1-style policy" as a policy object, which the fsdp2 family's drawn wrap
#: kinds reach only as a size-based callable
FSDP2_LOOKALIKES = (
    _scenario(FSDP2Config(WrapSpec("classes", _BLOCK))),
    _scenario(FSDP2Config(WrapSpec("module_wrap_policy", _BLOCK), reshard_after_forward=False)),
)
#: AC-1: activation checkpointing of a set of classes under each family that checkpoints by
#: its own policy (fsdp with the blocks as units, fsdp2 with the root as the only one)
AC_LOOKALIKES = (
    _scenario(FSDPConfig(wrap=WrapSpec("classes", _BLOCK), ac=ACSpec("classes", _BLOCK))),
    _scenario(FSDP2Config(ac=ACSpec("module_wrap_policy", _BLOCK))),
)
#: AC-1: a policy that selects the NestedBlock and the Blocks inside it: only the outer one
#: is checkpointed (no checkpoint wrapper inside another), and the Block beside it
AC_NESTED = _scenario(
    FSDP2Config(ac=ACSpec("classes", ("Block", "NestedBlock"))),
    ModelSpec(
        hidden=4, blocks=(BlockSpec("NestedBlock", ffn=2, inner=2), BlockSpec(ffn=3)), seed=6
    ),
)
