"""CONTRACT.md CKPT-RT-5 (and CKPT-SAVE-4, MP-3) as a stateful test: resuming from a
checkpoint equals never stopping.

:class:`ResumeMachine` lives in the controller. Its rules train one step (micro-batches
accumulated under ``no_backward_sync``, optionally clipped), save (in the segment's
format), or resume: load a saved checkpoint into fresh objects at a drawn world size (a
new *segment*, with new strategy options and format) and train on. The ranks keep nothing
between jobs, so every rule runs one job that replays its segment: set up (fresh init, or
fresh objects loaded from the segment's checkpoint), then the segment's steps and saves so
far. The invariant: the gathered parameters equal the plain, unsharded model trained in
this process on the same data (restored from its own snapshot where the sharded run loaded
a checkpoint), within the fp32 tolerance. Each save is judged as written against the plain
run at that moment (:mod:`suites.lib.controller.written_live`) before a segment loads it: a
wrong file fails there under the round trip's clause (this check reads ``blocked`` by it),
with the difference the round trip reports, and a load that fails on a right file says so.

Both runs train under a learning-rate scheduler with a linear warmup
(:mod:`suites.lib.shared.lr_schedules`), saved beside model and optimizer; the first saves
come in the middle of the warmup. A resumed segment loads it into a fresh scheduler: right
after the load it must hold the saved state (CKPT-SAVE-4: a load that writes the scheduler but
never restores it restarts the warmup), and at the load and after every step its
``get_last_lr()`` and the optimizer groups' ``lr`` are the plain run's, exactly (CKPT-RT-5:
the resumed run goes on along the same learning-rate curve). A failure prints the steps, e.g.
``state.resume(data=data(...), name=checkpoints_0, then=1, world=2)`` and the drawn options.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from harness import looking
from harness.verdicts.checked_file import loading_checked_file
from suites.lib.controller.checkpoint_plans import FAMILIES, load_scenarios
from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import (
    assert_close_state,
    backward_plain_step,
    reference_model,
)
from suites.lib.controller.scenarios import scenarios, world_sizes
from suites.lib.controller.tolerances import tolerance
from suites.lib.controller.written_live import check_written_now, plain_now
from suites.lib.ranks.checkpoint_jobs import path_for
from suites.lib.ranks.resume_jobs import Save, Segment, segment_rank
from suites.lib.shared.checkpoint_specs import FORMATS, ROUND_TRIP
from suites.lib.shared.lr_schedules import make_scheduler, read_scheduler, scheduler_difference
from suites.lib.shared.session_ops import Step
from suites.lib.shared.specs import Scenario, TrainPlan

#: model state, optimizer state, scheduler state, steps taken
Snapshot = tuple[dict, dict, dict, int]


class PlainReference:
    """The plain model, optimizer and warmup scheduler, trained in this process on every dp
    rank's data: the run that never stops."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.model = reference_model(scenario)
        self.optimizer = scenario.optim.build(self.model.named_parameters())
        self.scheduler = make_scheduler(self.optimizer)
        self.steps = 0

    def step(self, step: Step, dp: int) -> None:
        """One step as the sharded run takes it with ``dp`` data-parallel ranks."""
        backward_plain_step(self.model, self.scenario, step.index, step.micro, dp, step.clip)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.scheduler.step()
        self.steps += 1

    def lrs(self) -> dict[str, Any]:
        """The scheduler's reading now (:func:`read_scheduler`)."""
        return copy.deepcopy(read_scheduler(self.scheduler))

    def snapshot(self) -> Snapshot:
        """Model, optimizer and scheduler state and step count (deep copies)."""
        return (
            copy.deepcopy(self.model.state_dict()),
            copy.deepcopy(self.optimizer.state_dict()),
            copy.deepcopy(self.scheduler.state_dict()),
            self.steps,
        )

    def restore(self, snapshot: Snapshot) -> None:
        """Go back to a snapshot."""
        model, optim, scheduler, self.steps = copy.deepcopy(snapshot)
        self.model.load_state_dict(model)
        self.optimizer.load_state_dict(optim)
        self.scheduler.load_state_dict(scheduler)


@st.composite
def resume_scenarios(draw: st.DrawFn) -> Scenario:
    """An fp32 scenario whose optimizer has state (SGD with momentum, Adam, AdamW); the
    first (simplest) example ties, freezes, nests and holds buffers."""
    plan = TrainPlan(
        steps=0, batch_size=draw(st.integers(1, 3)), data_seed=draw(st.integers(0, 99))
    )
    tied, frozen, nested, scale = (draw(st.sampled_from((True, False))) for _ in range(4))
    family = draw(st.sampled_from(FAMILIES))
    scenario = draw(
        scenarios(
            family,
            plan=st.just(plan),
            optimizers=("adamw", "adam", "sgd"),
            tied=tied,
            frozen=frozen,
            nested=nested,
            scale=scale,
        )
    )
    return dataclasses.replace(scenario, optim=dataclasses.replace(scenario.optim, momentum=0.9))


#: (micro-batches, clip max_norm): accumulation and clipping first
STEPS = st.tuples(st.sampled_from((2, 1)), st.sampled_from((0.5, None)))


class ResumeMachine(RuleBasedStateMachine):
    """Train, save and load at random; the sharded run must track the plain one."""

    checkpoints = Bundle("checkpoints")

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="shardcheck-resume-")
        self.saved: dict[str, Snapshot] = {}
        #: what was found right in each checkpoint as written, by path
        self.found: dict[str, str] = {}
        self.state: list[dict[str, Any]] = []

    @initialize(
        target=checkpoints,
        scenario=resume_scenarios(),
        fmt=st.sampled_from(FORMATS),
        first=st.sampled_from((2, 1, 0)),
    )
    def start(self, scenario: Scenario, fmt: str, first: int) -> str:
        """Train ``first`` steps from a fresh init, then save."""
        self.base = scenario
        self.reference = PlainReference(scenario)
        self.segment = Segment(scenario, fmt)
        self.expected_lrs = [self.reference.lrs()]
        for _ in range(first):
            self._step(1, None)
        return self._save()

    def _step(self, micro: int, clip: float | None) -> None:
        step = Step(self.reference.steps, micro, clip)
        self.segment.ops.append(step)
        self.reference.step(step, self.segment.scenario.dp_size)
        self.expected_lrs.append(self.reference.lrs())

    def _save(self) -> str:
        world = self.segment.scenario.world_size
        name = f"ckpt{len(self.saved)}-{self.segment.fmt}-ws{world}"
        path = path_for(f"{self.root}/{name}", self.segment.fmt)
        self.segment.ops.append(Save(path))
        self.saved[name] = self.reference.snapshot()
        self._replay()
        self._judge_written(path)
        return name

    def _judge_written(self, path: str) -> None:
        """The checkpoint just saved, read as written, against the plain run at this moment:
        a wrong save fails here with the round trip's difference, not as the tolerance
        failure the resumed training would meet later ([Note: one cause, one finding])."""
        segment, optim = self.segment, self.base.optim
        tol = tolerance("32-true", optim.kind, lr=optim.max_lr, steps=self.reference.steps)
        model, optimizer = self.reference.model, self.reference.optimizer
        plain = plain_now(model, optimizer, self.base.model, "32-true", tol)
        where = (
            f"saved at world size {segment.scenario.world_size} ({segment.scenario.family}, "
            f"{segment.fmt}) after {self.reference.steps} steps"
        )
        self.found[path] = check_written_now(plain, segment.fmt, path, where=where)

    def _replay(self) -> None:
        found = self.found.get(self.segment.source or "", "")
        with self._looking(), loading_checked_file(found):
            self.state = run(
                segment_rank, self.segment, world_size=self.segment.scenario.world_size
            )

    def _looking(self) -> contextlib.AbstractContextManager[None]:
        """A resumed segment sees the state through the strategy's load: with a round-trip
        finding known, a failure there is blocked by it (harness.looking)."""
        return looking(*ROUND_TRIP.values()) if self.segment.source else contextlib.nullcontext()

    @rule(name=checkpoints, world=world_sizes(2), then=st.sampled_from((1, 2, 0)), data=st.data())
    def resume(self, name: str, world: int, then: int, data: st.DataObject) -> None:
        """Load ``name`` into fresh objects at ``world`` (new options and format), then take
        ``then`` steps: the resumed run of CKPT-RT-5, in one job."""
        drawn = data.draw(load_scenarios(self.base, world), label="load options")
        # a resumed run builds the same model (non-persistent buffers are not saved)
        scenario = dataclasses.replace(drawn, model=self.base.model, optim=self.base.optim)
        fmt = data.draw(st.sampled_from(FORMATS), label="format")
        source = path_for(f"{self.root}/{name}", name.split("-")[1])
        self.segment = Segment(scenario, fmt, source)
        self.reference.restore(self.saved[name])
        self.expected_lrs = [self.reference.lrs()]
        for _ in range(then):
            self._step(1, None)
        self._replay()

    @rule(step=STEPS)
    def train(self, step: tuple[int, float | None]) -> None:
        """One optimizer step (``micro`` micro-batches, optional clipping)."""
        self._step(*step)
        self._replay()

    @rule(target=checkpoints)
    def save(self) -> str:
        """Save in the segment's format."""
        return self._save()

    @invariant()
    def follows_the_learning_rate_curve(self) -> None:
        """Every rank's scheduler went through the plain run's learning rates, step by step,
        and its optimizer's groups hold them; a resumed one starts from the saved state."""
        if not self.state:
            return
        segment = self.segment
        with self._looking():
            for rank, out in enumerate(self.state):
                where = f"rank {rank} of {segment.scenario.world_size}"
                if segment.source is not None:
                    found = scheduler_difference(out["lrs"][0], self.expected_lrs[0])
                    assert found is None, (
                        f"CKPT-SAVE-4: {where}, resumed from {segment.source} into a fresh "
                        f"warmup scheduler: after the load it holds {found}; its "
                        "load_state_dict() was not given the saved state, so the resumed run "
                        "restarts its warmup"
                    )
                _assert_same_lrs(out["lrs"], self.expected_lrs, segment, where)

    @invariant()
    def tracks_the_plain_model(self) -> None:
        """Every rank's gathered parameters equal the plain model's (fp32 tolerance)."""
        if not self.state:
            return
        optim = self.base.optim
        tol = tolerance("32-true", optim.kind, lr=optim.max_lr, steps=self.reference.steps)
        expected = {k: v.detach() for k, v in self.reference.model.state_dict().items()}
        with self._looking():
            for rank, out in enumerate(self.state):
                assert_close_state(
                    out["state"],
                    expected,
                    tol,
                    what=f"CKPT-RT-5: rank {rank} of {self.segment.scenario.world_size}, after "
                    f"{self.reference.steps} steps: parameter/buffer",
                )

    def teardown(self) -> None:
        """Remove the checkpoints of this example."""
        shutil.rmtree(self.root, ignore_errors=True)


def _assert_same_lrs(
    found: list[dict[str, Any]], expected: list[dict[str, Any]], segment: Segment, where: str
) -> None:
    """CKPT-RT-5 on the learning rates: after the set-up (or the load) and after each step of
    ``segment``, the scheduler's ``get_last_lr()`` and the optimizer groups' ``lr`` are the
    run's that never stopped."""
    first = f"after the load of {segment.source}" if segment.source else "at the start"
    steps = [op for op in segment.ops if isinstance(op, Step)]
    labels = [first] + [f"after step {s.index + 1}" for s in steps]
    for label, got, want in zip(labels, found, expected, strict=True):
        for key, what in (("last_lr", "the scheduler's last_lr"), ("group_lrs", "the groups' lr")):
            assert got[key] == want[key], (
                f"CKPT-RT-5: {where}, {label}: {what} {got[key]} where the run that never "
                f"stopped has {want[key]} ({what} at each point: "
                f"{[g[key] for g in found]}, expected {[e[key] for e in expected]})"
            )


# A state machine runs inside a plain test function, so the plugin's timeout scaled to the
# profile does not reach it: the same rule here (300 s under ci and dev, 7500 under
# nightly, whose 75 sessions ran past 300 s on this machine). Sessions: half the profile's
# examples (ci 3, dev 12, nightly 125).
@pytest.mark.timeout(max(300, 30 * settings().max_examples))
@pytest.mark.clause("CKPT-RT-5", "CKPT-SAVE-4", "MP-3")
def test_resume_equals_training_without_stopping() -> None:
    base = settings().max_examples
    run_state_machine_as_test(
        ResumeMachine,
        settings=settings(max_examples=max(1, base // 2), stateful_step_count=4),
    )
