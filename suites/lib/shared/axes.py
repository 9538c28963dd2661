"""The configuration axes a scenario exercises, for the run's coverage table.

:func:`scenario_axes` names, for one scenario (and the checkpoint format it saves or loads
in, if any), the value it takes on each main axis: family, sharding layout, precision, wrap
kind, world size, checkpoint format and the model zoo's kinds. The controller reports them
for every job it dispatches (:func:`suites.lib.controller.dispatch.run`); the conformance
plugin counts the pairs of values exercised by the jobs of passing checks
(:mod:`harness.conformance.coverage`).
"""

from __future__ import annotations

from suites.lib.shared.specs import FSDP2Config, FSDPConfig, Scenario

__all__ = [
    "AXES",
    "HELD_GRADIENTS_LOAD",
    "MOMENTS",
    "fsdp2_layout",
    "moment_pairs",
    "scenario_axes",
]

#: the axes, in the order the coverage table shows them
AXES = ("family", "sharding", "precision", "wrap", "world_size", "checkpoint", "model", "moment")


def fsdp2_layout(config: FSDP2Config) -> str:
    """The fsdp2 family's value on the sharding axis: HSDP on a 2-D mesh, else what
    ``reshard_after_forward`` does after a forward."""
    if config.device_mesh is not None:
        return "hsdp"
    raf = config.reshard_after_forward
    if isinstance(raf, bool):
        return "reshard after forward" if raf else "no reshard after forward"
    return f"reshard to {raf}"


def _sharding(scenario: Scenario) -> str:
    strategy = scenario.strategy
    if isinstance(strategy, FSDPConfig):
        return strategy.sharding_strategy
    if isinstance(strategy, FSDP2Config):
        return fsdp2_layout(strategy)
    dp, tp = strategy.data_parallel_size, strategy.tensor_parallel_size
    if dp > 1 and tp > 1:
        return "dp+tp"
    return "tp" if tp > 1 else "dp" if dp > 1 else "one rank"


def _wrap(scenario: Scenario) -> str:
    strategy = scenario.strategy
    if isinstance(strategy, (FSDPConfig, FSDP2Config)):
        return strategy.wrap.kind
    return "fully_shard " + ("+".join(sorted(strategy.fsdp_classes)) or "root only")


def _model_kinds(scenario: Scenario) -> tuple[str, ...]:
    model = scenario.model
    kinds = [
        f"attention({block.attention})" if block.kind == "AttentionBlock" else block.kind
        for block in model.blocks
    ]
    if model.root_param:
        kinds.append("root parameter")
    if model.shared:
        kinds.append("shared module")
    if model.tied:
        kinds.append("tied embedding")
    if model.frozen:
        kinds.append("frozen parameters")
    if model.scale:
        kinds.append("buffers")
    if model.running_stats:
        kinds.append("running statistics")
    return tuple(sorted(set(kinds)))


def scenario_axes(scenario: Scenario, fmt: str | None = None) -> dict[str, tuple[str, ...]]:
    """The values ``scenario`` takes on each axis (the model axis may take several).

    Args:
        scenario: the scenario a job runs.
        fmt: the checkpoint format the job saves or loads in (``full``/``sharded``), if any.
    """
    axes = {
        "family": (scenario.family,),
        "sharding": (_sharding(scenario),),
        "precision": (scenario.precision,),
        "wrap": (_wrap(scenario),),
        "world_size": (str(scenario.world_size),),
        "model": _model_kinds(scenario),
    }
    if fmt is not None:
        axes["checkpoint"] = (fmt,)
    return axes


#: When a job saves a checkpoint (the ``moment`` axis; CKPT-RT-1/2 and TRAIN-4 name it in
#: their scope): after an optimizer step (the ordinary moment); before the first step, when
#: the optimizer has no state yet (a recipe validating its checkpointing at step 0); a second
#: save of the same objects after more training; between the micro-batches of an accumulated
#: step, gradients pending (a time-based or pre-emption save). One moment is a load's: into
#: objects whose optimizer never stepped while their parameters hold gradients (a recipe that
#: ran a forward and a backward, then resumed; :data:`HELD_GRADIENTS_LOAD`). A job reports
#: the moments of its saves and loads (``moments`` of its plan or segment:
#: :mod:`suites.lib.controller.dispatch`).
HELD_GRADIENTS_LOAD = "load with gradients held"
MOMENTS = (
    "after a step",
    "before first step",
    "second save",
    "mid-accumulation",
    HELD_GRADIENTS_LOAD,
)


def moment_pairs(
    moments: tuple[str, ...], values: dict[str, set[str]]
) -> set[tuple[str, str, str, str]]:
    """Pairs of the coverage's universe (axes in name order) that put each of ``moments``
    beside each of ``values`` (axis -> values): what a suite declares for the moments its
    checks reach by construction (``HarnessSession.note_universe``)."""
    found: set[tuple[str, str, str, str]] = set()
    for moment in moments:
        for axis, seen in values.items():
            for value in seen:
                (a, va), (b, vb) = sorted([("moment", moment), (axis, value)])
                found.add((a, va, b, vb))
    return found
