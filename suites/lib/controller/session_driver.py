"""The training-session check's driver (CONTRACT.md TRAIN-4): actions, segments, the twin.

:class:`SessionDriver` holds what a session holds: the plain twin
(:mod:`suites.lib.controller.session_twin`), the current segment
(:mod:`suites.lib.shared.session_ops`) and the checkpoints saved so far. Each ``do_*``
action appends its ops to the segment and applies them to the twin. The ranks' state is read
(a ``Check`` op, with the twin's state at that point and the clause it checks) before a live
load if anything happened since the last read, after every load, and at the segment's end;
at the session's end the job also saves the end state and loads it into fresh objects beside
the live ones. A segment goes to the ranks once, when it ends (a load into fresh objects, a
conversion, the session's end: :meth:`SessionDriver._flush`), so a
session of n rules costs a few rank jobs, not n replays. The state machine of
``suites/test_training_session.py`` draws the actions' arguments;
:func:`scripted_session` calls every action on a fixed, demanding scenario per family.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness import looking
from suites.lib.controller.checkpoint_checks import convert_offline
from suites.lib.controller.checkpoint_plans import FAMILIES, load_scenarios
from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import reference_model
from suites.lib.controller.session_draws import COUNTS, covering_scenario
from suites.lib.controller.session_twin import Expected, Snapshot, Twin, check_reads
from suites.lib.controller.tolerances import TABLE
from suites.lib.controller.written import judged_if_it_fails
from suites.lib.shared.axes import HELD_GRADIENTS_LOAD as PENDING
from suites.lib.shared.checkpoint_specs import ROUND_TRIP
from suites.lib.shared.models import clean_name
from suites.lib.shared.session_ops import (
    AddGroup,
    Check,
    Freeze,
    Load,
    Rebuild,
    Save,
    Segment,
    Step,
)
from suites.lib.shared.specs import Scenario

__all__ = [
    "SHORT_MOMENTS",
    "Micro",
    "Saved",
    "SessionDriver",
    "frozen_start_session",
    "scripted_session",
    "short_session",
    "trainable",
]

#: the moments a :func:`short_session` saves at (after a step, then the end state's save)
SHORT_MOMENTS = ("after a step", "second save")

Micro = tuple[int, float | None]


@dataclass(frozen=True)
class Saved:
    """A checkpoint of the session: where, its format and family, the twin's state then."""

    path: str
    fmt: str
    family: str
    snapshot: Snapshot


def trainable(scenario: Scenario) -> list[str]:
    """Names of the parameters that train, in order."""
    model = reference_model(scenario)
    return [clean_name(n) for n, p in model.named_parameters() if p.requires_grad]


class SessionDriver:
    """A training session's actions and its plain twin; a segment goes to the ranks (with
    ``job``, checkpoint paths from ``path``: the rank side's, which the test module gives)
    when it ends, and its reads are checked against the twin then."""

    family = "fsdp"
    #: report the moments of the session's saves (the coverage's ``moment`` axis); off for a
    #: session whose check is also another clause's, one that does not speak of moments
    note_moments = True
    job: Callable[..., Any]
    probe: Callable[..., Any]  # rank job: set up a scenario and tear it down
    path: Callable[[str, str, str], str]

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="shardcheck-session-")
        self.saved: dict[str, Saved] = {}
        self.expected: list[Expected] = []  # what each read of the segment must equal
        self.started = self.finished = 0  # rules begun / rules that returned
        self.probed: set[tuple[Scenario, str]] = set()  # configurations the strategy accepted
        # the live objects' saves: whether they saved, and trained since (second save)
        self.saved_here = self.trained_since = False

    # --- actions: the rules draw their arguments and call these (so does the script) ------

    def begin(self, scenario: Scenario, fmt: str, held: str, warmup: list[Micro]) -> None:
        """Set the session up and train ``warmup`` (adding the held-back parameter's group
        after the first step when ``warmup`` has two steps)."""
        self.base = scenario
        self.names = trainable(scenario)
        self.held, self.added, self.frozen = held, False, set[str]()
        self.twin = Twin(scenario, (held,))
        self.precisions = {scenario.precision}
        self._probe(scenario, fmt)
        self.segment = Segment(scenario, fmt, (held,))
        for i, micro in enumerate(warmup):
            self.do_train(micro, count=False)
            if i == 0 and len(warmup) == 2:
                self.do_add_group(0.05, count=False)

    def _probe(self, scenario: Scenario, fmt: str) -> None:
        """Set ``scenario`` up once on the ranks before its segment: segments run lazily, and
        a refusal first met at the session's teardown could not reject the example."""
        if (scenario, fmt) not in self.probed:
            run(self.probe, scenario, fmt, world_size=scenario.world_size)
            self.probed.add((scenario, fmt))

    def _count(self, name: str) -> None:
        """Count rule ``name`` for the family whose objects it ran on."""
        COUNTS[(self.segment.scenario.family, name)] += 1

    def _moment(self, moment: str | None = None) -> str:
        """Note a save of the live objects now, at ``moment`` or at the moment it is
        (:data:`~suites.lib.shared.axes.MOMENTS`), for the segment's coverage: before the
        first step while the optimizer has no state (the twin's has none), a second save once
        these objects saved and trained since, else after a step."""
        if moment is None:
            if not self.twin.optimizer.state:
                moment = "before first step"
            elif self.saved_here and self.trained_since:
                moment = "second save"
            else:
                moment = "after a step"
        self.saved_here, self.trained_since = True, False
        self._note(moment)
        return moment

    def _note(self, moment: str) -> None:
        """Report ``moment`` in the segment's coverage (unless the session reports none)."""
        if self.note_moments:
            self.segment.moments.append(moment)

    def _check(self, clause_id: str = "TRAIN-4") -> None:
        """Read the ranks' state here, to compare with the twin's now."""
        self.segment.ops.append(Check(len(self.expected)))
        self.expected.append((clause_id, self.twin.expected(), self.twin.steps))

    def _settle(self) -> None:
        """Read the ranks' state here unless nothing happened since the last read (before a
        load replaces the state, so that what led up to it is checked)."""
        if self.segment.ops and not isinstance(self.segment.ops[-1], Check):
            self._check()

    def _flush(self, *, probe: bool = False) -> None:
        """Run the current segment on the ranks and compare every read with the twin; with
        ``probe`` (the session's end) the job also saves the end state and loads it into
        fresh objects, which must hold it too."""
        segment = self.segment
        if not self.expected and not segment.ops:
            return
        if probe:
            segment.probe = self.path(self.root, "probe", segment.fmt)
            self._moment()
        end = ("TRAIN-4", self.twin.expected(), self.twin.steps)
        self.precisions.add(segment.scenario.precision)
        loosest = max(self.precisions, key=lambda p: TABLE[(p, "sgd")].rtol)
        # a segment that loads a checkpoint sees the state through the strategy's load: with a
        # round-trip finding already known, a failure here is blocked by it
        with looking(*ROUND_TRIP.values()) if _loads(segment) else contextlib.nullcontext():
            with self._judged_if_it_fails(segment.scenario, segment.probe):
                out = run(self.job, segment, world_size=segment.scenario.world_size)
            check_reads(out, [*self.expected, end], segment.scenario, self.base.optim, loosest)
        self.expected = []
        segment.ops = []
        segment.moments = []

    def _judged_if_it_fails(
        self, scenario: Scenario, probe: str | None
    ) -> contextlib.AbstractContextManager[None]:
        """Around a segment's job: when it fails, the checkpoints the session wrote (its saves,
        the segment's rebuilds and the end's probe) are judged as written first
        (:func:`~suites.lib.controller.written.judged_if_it_fails`), so a load that met a
        wrong file is that file's finding. The twin follows the session's
        training step by step, not a scenario's, so the model's entries, shapes and dtypes
        are judged (``values=False``); the values are the reads' own comparison."""
        stack = contextlib.ExitStack()
        files = [(saved.fmt, saved.path) for saved in self.saved.values()]
        rebuilt = [op.path for op in self.segment.ops if isinstance(op, Rebuild)]
        files += [(self.segment.fmt, path) for path in [*rebuilt, probe] if path is not None]
        for fmt in ("full", "sharded"):
            saves = [(scenario, path) for f, path in files if f == fmt]
            if saves:
                stack.enter_context(judged_if_it_fails(fmt, saves, values=False))
        return stack

    def do_train(self, micro: Micro, *, count: bool = True) -> None:
        op = Step(self.twin.steps, *micro)
        self.segment.ops.append(op)
        self.twin.step(op, self.segment.scenario.dp_size)
        self.trained_since = True
        if count:
            self._count("train")

    def do_save_mid_step(self, micro: Micro) -> str:
        """One optimizer step of ``micro`` (2 micro-batches or more) with a save after the
        first micro-batch, its gradients accumulated and the step not taken: the checkpoint
        holds the state before the step (a checkpoint holds no gradients), and the step then
        goes on as it would have without the save."""
        if micro[0] < 2:
            raise ValueError(f"a save mid-accumulation needs 2 micro-batches or more: {micro}")
        fmt, family = self.segment.fmt, self.segment.scenario.family
        name = f"ckpt{len(self.saved)}-{fmt}-{family}"
        path = self.path(self.root, name, fmt)
        self.saved[name] = Saved(path, fmt, family, self.twin.snapshot())
        self._moment("mid-accumulation")
        op = Step(self.twin.steps, *micro, save=path)
        self.segment.ops.append(op)
        self.twin.step(op, self.segment.scenario.dp_size)
        self.trained_since = True
        self._count("save_mid_step")
        return name

    def do_freeze(self, name: str, frozen: bool = True) -> None:
        (self.frozen.add if frozen else self.frozen.discard)(name)
        op = Freeze(name, frozen)
        self.segment.ops.append(op)
        self.twin.change(op)
        self._count("freeze" if frozen else "unfreeze")

    def do_add_group(self, lr: float, *, count: bool = True) -> None:
        self.added = True
        op = AddGroup(self.held, lr)
        self.segment.ops.append(op)
        self.twin.change(op)
        if count:
            self._count("add_group")

    def do_save(self) -> str:
        fmt, family = self.segment.fmt, self.segment.scenario.family
        name = f"ckpt{len(self.saved)}-{fmt}-{family}"
        path = self.path(self.root, name, fmt)
        self.saved[name] = Saved(path, fmt, family, self.twin.snapshot())
        self._moment()
        self.segment.ops.append(Save(path, fmt))
        self._count("save")
        return name

    def do_load_live(self, name: str, strict: bool) -> None:
        """Load ``name`` into the live objects (into fresh ones of the saved structure at the
        same options when the session's structure has changed since)."""
        saved = self.saved[name]
        self._count("load_live")
        if saved.snapshot[2] != self.twin.structure:
            self._fresh(saved, strict, self.segment.scenario, self.segment.fmt)
            return
        self._settle()
        self.twin.restore(saved.snapshot)
        self.segment.ops.append(Load(saved.path, strict))
        self._check()

    def load_options(self, world: int, family: str, data: Any) -> Scenario:
        """Fresh objects' options of ``family`` at ``world``, drawn (same model, optimizer)."""
        return self._own(data.draw(load_scenarios(self.base, world, family), label="options"))

    def do_convert(self, name: str, scenario: Scenario, fmt: str) -> None:
        """Convert sharded ``name`` offline into a full checkpoint; load that into ``scenario``."""
        self._flush()  # the sharded checkpoint is written when its segment runs
        saved = self.saved[name]
        full = Saved(
            self.path(self.root, f"conv{len(self.saved)}", "full"),
            "full",
            saved.family,
            saved.snapshot,
        )
        convert_offline(saved.path, full.path)
        self.saved[f"conv{len(self.saved)}-full-{saved.family}"] = full
        self._fresh(full, True, self._own(scenario), fmt, "CKPT-RT-4")
        self._count("convert")

    def do_load_fresh(
        self, name: str, scenario: Scenario, fmt: str, *, strict: bool, pending: bool = False
    ) -> None:
        """Load ``name`` into fresh objects of ``scenario`` (its family) saving in ``fmt``;
        with ``pending``, objects that ran a forward and a backward first (gradients held,
        their optimizer never stepped), which drop those gradients after the load."""
        self._fresh(self.saved[name], strict, self._own(scenario), fmt, pending=pending)
        self._count("load_fresh")

    def do_load_other_family(self, name: str, scenario: Scenario, fmt: str) -> None:
        """Load full ``name`` into fresh objects of ``scenario``, of the other family."""
        self._fresh(self.saved[name], True, self._own(scenario), fmt, "CKPT-RT-6")
        self._count("load_other_family")

    def _own(self, scenario: Scenario) -> Scenario:
        """``scenario`` with the session's model and optimizer (those of the twin)."""
        return dataclasses.replace(scenario, model=self.base.model, optim=self.base.optim)

    def _fresh(
        self,
        saved: Saved,
        strict: bool,
        scenario: Scenario,
        fmt: str,
        clause_id: str = "TRAIN-4",
        *,
        pending: bool = False,
    ) -> None:
        """End the segment; load ``saved`` into fresh objects of ``scenario`` (after a
        forward and a backward with ``pending``)."""
        self._flush()
        self._probe(scenario, fmt)
        self.twin.restore(saved.snapshot)
        structure = saved.snapshot[2]
        self.frozen = set(structure.frozen)
        self.added = bool(structure.groups)
        self.segment = Segment(
            scenario, fmt, (self.held,), structure, saved.path, strict, clause_id, pending=pending
        )
        self.saved_here = self.trained_since = False  # fresh objects
        if pending:
            self._note(PENDING)
        self._check(clause_id)

    def do_rebuild(self, pending: bool = False) -> None:
        """Save, tear down, set up again and load (the new objects holding gradients first
        with ``pending``)."""
        path = self.path(self.root, f"rebuild{len(self.segment.ops)}", self.segment.fmt)
        self._moment()
        self.segment.ops.append(Rebuild(path, pending))
        self.saved_here = False  # the objects are built again
        if pending:
            self._note(PENDING)
        self._count("rebuild")

    def close(self) -> None:
        """Run the last segment (unless a rule failed) and remove the checkpoints."""
        try:
            if self.started and self.finished == self.started:
                self._flush(probe=True)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def offered_other(family: str) -> str:
    """The family a cross-family session of ``family`` loads into: the first other one the
    strategy has not refused as a whole in this session (the first other one when it refused
    them all: its set-up probe then meets the refusal again)."""
    from harness.run.session import current

    others = [f for f in FAMILIES if f != family]
    remembered = current().remembered
    return next((f for f in others if remembered.refused_every((f,)) is None), others[0])


def cross_family_session(driver: type[SessionDriver], family: str) -> None:
    """CKPT-RT-6 in a session: on :func:`covering_scenario` of ``family``, a full save loaded
    into fresh objects of the other family (:func:`offered_other`), training there, and a save
    of those loaded back into objects of ``family``, the rule running on both families'
    objects; each load must hold the plain twin's state. Set-up probes first, so that a
    strategy that refuses the other family is refused before any session job."""
    other = offered_other(family)
    session = type(f"Cross{family}", (driver,), {"family": family})()
    scenario = covering_scenario(family)
    names = trainable(scenario)
    try:
        session._probe(covering_scenario(other), "full")  # refused here, before any segment
        session.begin(scenario, "full", names[-1], [(2, 0.5)])
        session.do_add_group(0.2)
        session.do_train((1, None))
        there = session.do_save()
        session.do_load_other_family(there, covering_scenario(other), "full")  # job 1
        session.do_train((1, 0.5))
        back = session.do_save()  # and back: the rule runs on both families' objects
        session.do_load_other_family(back, covering_scenario(family, 2), "sharded")  # job 2
        session.do_train((1, None))
        session.finished = session.started = 1
    finally:
        session.close()  # job 3
    COUNTS[(family, "cross-family scripted")] += 1


def scripted_session(driver: type[SessionDriver], family: str) -> None:
    """Every rule once or more on :func:`covering_scenario` of ``family``, by construction
    (the drawn sessions may miss a rule with few examples; ``ci`` draws 5 per family), and
    a save at every moment of :data:`~suites.lib.shared.axes.MOMENTS`, each loaded back:
    before the first step (loaded into fresh objects, whose optimizer must have no state,
    then trained on), a second save of the same objects after more training (loaded through
    the offline conversion), one between accumulated micro-batches (loaded into the live
    objects after the step it interrupted), and a load into objects that hold gradients
    before their first step (the rebuild). Four rank jobs, the first two at world size 4.
    Objects of ``family`` only: the loads into another family are
    :func:`cross_family_session`'s, so that a strategy of one family runs this one."""
    session = type(f"Scripted{family}", (driver,), {"family": family})()
    scenario = covering_scenario(family)
    names = trainable(scenario)
    try:
        session.begin(scenario, "sharded", names[-1], [])
        zero = session.do_save()  # before the first step
        session.do_train((2, 0.5))
        session.do_freeze(names[0])
        session.do_train((1, None))
        first = session.do_save()  # a second save: the objects saved and trained since
        session.do_add_group(0.2)
        session.do_freeze(names[0], frozen=False)
        mid = session.do_save_mid_step((3, 0.5))
        second = session.do_save()
        session.do_train((1, None))
        session.do_load_live(mid, strict=True)  # back before the step it was taken in
        session.do_train((1, None))
        session.do_load_live(second, strict=False)
        session.do_rebuild(pending=True)  # the new objects hold gradients at the load
        session.do_convert(first, scenario, "full")  # job 1
        session.do_train((2, None))
        session.do_save()  # a save the next load replaces (the cross-family session's)
        session.do_train((1, 0.5))
        session.do_load_fresh(zero, covering_scenario(family, 2), "full", strict=False)  # job 2
        session.do_train((2, None))
        session.finished = session.started = 1
    finally:
        session.close()  # job 4
    COUNTS[(family, "scripted")] += 1


def short_session(driver: type[SessionDriver], scenario: Scenario, fmt: str) -> None:
    """TRAIN-4's changes, a save and a live load on ``scenario`` (one of the clause's
    covering configurations), in two rank jobs: the set-up probe and one segment, whose end
    state is also saved and loaded into fresh objects. The save comes while a parameter
    with optimizer state is frozen and after a group was added; the load brings both back,
    and the parameter trains again from the state it kept. The end state's save is a second
    save of the same objects, after more training (:data:`SHORT_MOMENTS`)."""
    session = type(f"Short{scenario.family}", (driver,), {"family": scenario.family})()
    names = trainable(scenario)
    try:
        session.begin(scenario, fmt, names[-1], [(2, 0.5), (1, None)])  # adds the group
        session.do_freeze(names[0])  # it has optimizer state after the warm-up steps
        session.do_train((1, None))
        saved = session.do_save()
        session.do_train((2, None))
        session.do_load_live(saved, strict=False)
        session.do_freeze(names[0], frozen=False)
        session.do_train((1, 0.5))
        session.finished = session.started = 1
    finally:
        session.close()


def frozen_start_session(driver: type[SessionDriver], scenario: Scenario, unit: str) -> None:
    """Every parameter of ``unit`` (a module name) frozen before the model's first forward,
    one step, the unit unfrozen, two more steps (PREC-2, TRAIN-4), in two rank jobs: a
    fine-tuning recipe that trains a unit it froze at the start. Under a mixed precision the
    unit's gradients must still reduce in the low dtype onto float32 master parameters, and
    the session track the plain twin."""
    session = type(f"FrozenStart{scenario.family}", (driver,), {"family": scenario.family})()
    names = trainable(scenario)
    frozen = [n for n in names if n.startswith(f"{unit}.")]
    if not frozen or len(frozen) == len(names):
        raise ValueError(f"unit {unit!r} must hold some but not all of the parameters: {names}")
    try:
        session.begin(scenario, "sharded", names[-1], [])  # no step yet: nothing ran forward
        session.do_add_group(0.05, count=False)
        for name in frozen:
            session.do_freeze(name)
        session.do_train((1, None))
        for name in frozen:
            session.do_freeze(name, frozen=False)
        session.do_train((2, None))
        session.do_train((1, 0.5))
        session.finished = session.started = 1
    finally:
        session.close()


def _loads(segment: Segment) -> bool:
    """Whether ``segment``'s job loads a checkpoint (its source, a load, a rebuild or the
    probe at the session's end)."""
    return bool(
        segment.source
        or segment.probe
        or any(isinstance(op, (Load, Rebuild)) for op in segment.ops)
    )
