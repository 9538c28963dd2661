"""The operations of a training session (CONTRACT.md TRAIN-4), as data both sides read.

The controller's state machine (``suites/test_training_session.py``) draws them and its plain
twin (:mod:`suites.lib.controller.session_twin`) applies them in this process; a
:class:`Segment` of them crosses to the ranks in one job when it ends (a load into fresh
objects starts the next, or the session ends), and the ranks run it once
(:mod:`suites.lib.ranks.session_jobs`), reading the state at each :class:`Check`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from suites.lib.shared.specs import Scenario

__all__ = [
    "AddGroup",
    "Check",
    "Freeze",
    "Load",
    "Op",
    "Rebuild",
    "Save",
    "Segment",
    "Step",
    "Structure",
    "after",
]


@dataclass(frozen=True)
class Step:
    """One optimizer step: global data index, micro-batches, clip ``max_norm`` or None; with
    ``save`` (a path), a save there after the first micro-batch, its gradients accumulated
    and the step not taken yet (the ``mid-accumulation`` moment)."""

    index: int
    micro: int
    clip: float | None
    save: str | None = None


@dataclass(frozen=True)
class Freeze:
    """Set ``requires_grad`` of parameter ``name`` to ``not frozen``."""

    name: str
    frozen: bool = True


@dataclass(frozen=True)
class AddGroup:
    """``optimizer.add_param_group`` with parameter ``name`` at learning rate ``lr``."""

    name: str
    lr: float


@dataclass(frozen=True)
class Save:
    """Save model and optimizer to ``path`` in format ``fmt`` (``full`` or ``sharded``)."""

    path: str
    fmt: str


@dataclass(frozen=True)
class Load:
    """Load ``path`` into the live model and optimizer."""

    path: str
    strict: bool


@dataclass(frozen=True)
class Rebuild:
    """Save to ``path``, tear the strategy down, build it again and load ``path``; with
    ``pending``, the new objects run a forward and a backward before the load (their
    optimizer never stepped, their parameters hold gradients) and drop those gradients
    after it."""

    path: str
    pending: bool = False


@dataclass(frozen=True)
class Check:
    """Read the gathered model and optimizer state here (the controller compares read
    ``index`` of the segment with the twin's state at the same point)."""

    index: int


@dataclass(frozen=True)
class Structure:
    """The session's structural changes so far: frozen names and added groups (in order)."""

    frozen: frozenset[str] = frozenset()
    groups: tuple[AddGroup, ...] = ()


Op = Step | Freeze | AddGroup | Save | Load | Rebuild | Check


@dataclass
class Segment:
    """Set up ``scenario`` (with ``structure`` applied and ``source`` loaded), then ``ops``.

    ``held`` names the parameters the optimizer is built without (added as groups later).
    ``load_clause`` is the clause the load of ``source`` exercises (``TRAIN-4``; ``CKPT-RT-4``
    for a checkpoint converted offline, ``CKPT-RT-6`` for one of the other family). With
    ``probe`` (a checkpoint path), the job also saves the state the ops reach there and
    loads it into fresh objects of the same structure: what the check compares twice.
    ``moments`` are the moments of its saves (:data:`suites.lib.shared.axes.MOMENTS`), for
    the coverage's ``moment`` axis. With ``pending``, the fresh objects run a forward and a
    backward before loading ``source`` (gradients held, the optimizer never stepped: the
    ``load with gradients held`` moment) and drop those gradients after the load.
    """

    scenario: Scenario
    fmt: str
    held: tuple[str, ...]
    structure: Structure = field(default_factory=Structure)
    source: str | None = None
    strict: bool = True
    load_clause: str = "TRAIN-4"
    ops: list[Op] = field(default_factory=list)
    probe: str | None = None
    moments: list[str] = field(default_factory=list)
    pending: bool = False


def after(structure: Structure, op: Freeze | AddGroup) -> Structure:
    """``structure`` once ``op`` is applied."""
    if isinstance(op, AddGroup):
        return dataclasses.replace(structure, groups=(*structure.groups, op))
    frozen = structure.frozen | {op.name} if op.frozen else structure.frozen - {op.name}
    return dataclasses.replace(structure, frozen=frozenset(frozen))
