"""The configuration axes a scenario exercises, for the run's coverage table.

:func:`scenario_axes` names, for one scenario (and the checkpoint format it saves or loads
in, if any), the value it takes on each main axis: family, sharding layout, precision, wrap
kind, world size, checkpoint format and the model zoo's kinds; and, for a policy of classes,
what it meets in the model (:func:`class_words`: the contract's words "each instance of those
classes", :mod:`harness.clauses.words`). The controller reports them for every job it
dispatches (:func:`suites.lib.controller.dispatch.run`); the conformance plugin counts the
pairs of values exercised by the jobs of passing checks
(:mod:`harness.conformance.output.coverage`).
"""

from __future__ import annotations

import functools

from harness.clauses import WORD_AXES, ClassWords
from suites.lib.shared.models import ModelSpec, build_model, module_class
from suites.lib.shared.specs import FSDP2Config, FSDPConfig, Scenario

__all__ = [
    "AXES",
    "HELD_GRADIENTS_LOAD",
    "MOMENTS",
    "POLICY_CLASS_KINDS",
    "class_words",
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


#: the policy kinds that hand the strategy classes: "with a set of classes or a
#: ``ModuleWrapPolicy``, each instance of those classes" (WRAP-1, FSDP2-1, AC-1)
POLICY_CLASS_KINDS = ("classes", "module_wrap_policy")


@functools.cache
def class_words(model: ModelSpec, classes: tuple[str, ...]) -> tuple[str, ...]:
    """What a policy of the zoo classes ``classes`` meets in ``model``'s modules
    (:class:`harness.clauses.ClassWords`): instances of a listed class, instances of a subclass
    of one (which it selects), modules of another class named like one (which it does not),
    and a selected module inside another selected one."""
    listed = tuple(module_class(name) for name in classes)
    found: set[str] = set()
    selected: list[str] = []
    for name, module in build_model(model, "meta").named_modules():
        if isinstance(module, listed):
            found.add(ClassWords.LISTED if type(module) in listed else ClassWords.SUBCLASS)
            if name and any(name.startswith(f"{outer}.") for outer in selected):
                found.add(ClassWords.NESTED)
            selected.append(name)
        elif type(module).__name__ in classes:
            found.add(ClassWords.SAME_NAME)
    return tuple(w for w in (*ClassWords.ALL, ClassWords.NESTED) if w in found)


def _words(scenario: Scenario) -> dict[str, tuple[str, ...]]:
    """The word axes of ``scenario``'s wrap and checkpointing policies of classes."""
    strategy = scenario.strategy
    if not isinstance(strategy, (FSDPConfig, FSDP2Config)):
        return {}
    found = {}
    if strategy.wrap.kind in POLICY_CLASS_KINDS:  # nested units are no word of WRAP-1
        words = class_words(scenario.model, strategy.wrap.classes)
        found["wrap classes"] = tuple(w for w in words if w != ClassWords.NESTED)
    if strategy.ac.kind in POLICY_CLASS_KINDS:
        found["checkpointing classes"] = class_words(scenario.model, strategy.ac.classes)
    return {axis: words for axis, words in found.items() if words}


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
        **_words(scenario),
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
    checks reach by construction (``HarnessSession.note_universe``). The contract's words
    (:data:`harness.clauses.WORD_AXES`) are no configuration's values: they take no pairs."""
    found: set[tuple[str, str, str, str]] = set()
    for moment in moments:
        for axis, seen in values.items():
            if axis in WORD_AXES:
                continue
            for value in seen:
                (a, va), (b, vb) = sorted([("moment", moment), (axis, value)])
                found.add((a, va, b, vb))
    return found
