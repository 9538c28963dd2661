"""SPEC.md TRAIN-4 as a stateful test: a whole training session against a plain twin.

:class:`TrainingSession` lives in the controller. At ``initialize`` it draws the family and
the strategy's options (sharding strategy and mesh, wrap policy, optimizer, model), and one
parameter the optimizer is built without. Its rules are the operations of a real run:
train one step (1-3 micro-batches accumulated under ``no_backward_sync``, optional
clipping); freeze a parameter (one with optimizer state, once trained), unfreeze it; add the
held-back parameter as a new group; save (full or sharded); load a checkpoint strictly or
not into the live objects, or into fresh ones at a drawn world size; tear the strategy down
and rebuild it. The ranks keep nothing between jobs, so every rule replays the current
segment (:mod:`suites.session_jobs`). The invariant: every rank's gathered parameters,
buffers and optimizer state (step counts and group hyper-parameters included) equal the
plain twin's (:mod:`suites.session_twin`) within the fp32 tolerance. Hypothesis shrinks a
failing session to its shortest op sequence and prints it.
"""

from __future__ import annotations

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
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness.attribution import clause
from suites._run import run
from suites.checkpoint_plans import FAMILIES, FORMATS, load_scenarios
from suites.models import clean_name
from suites.oracles import reference_model
from suites.scenarios import scenarios, world_sizes
from suites.session_jobs import (
    AddGroup,
    Freeze,
    Load,
    Rebuild,
    Save,
    Segment,
    Step,
    checkpoint_path,
    segment_rank,
)
from suites.session_twin import Snapshot, Twin, assert_matches
from suites.specs import Scenario, TrainPlan
from suites.tolerances import tolerance

#: (micro-batches, clip max_norm): accumulation and clipping first
STEPS = st.tuples(st.sampled_from((2, 1, 3)), st.sampled_from((0.5, None)))


@st.composite
def session_scenarios(draw: st.DrawFn) -> Scenario:
    """An fp32 scenario whose optimizer has state, of a drawn family."""
    plan = TrainPlan(
        steps=0, batch_size=draw(st.integers(1, 3)), data_seed=draw(st.integers(0, 99))
    )
    family = draw(st.sampled_from(FAMILIES))
    scenario = draw(
        scenarios(family, plan=st.just(plan), optimizers=("adamw", "adam", "sgd"), tied=False)
    )
    return dataclasses.replace(scenario, optim=dataclasses.replace(scenario.optim, momentum=0.9))


def _trainable(scenario: Scenario) -> list[str]:
    """Names of the parameters that train, in order."""
    model = reference_model(scenario)
    return [clean_name(n) for n, p in model.named_parameters() if p.requires_grad]


class TrainingSession(RuleBasedStateMachine):
    """A training run's operations at random; the sharded run must track the plain twin."""

    checkpoints = Bundle("checkpoints")

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="shardcheck-session-")
        self.saved: dict[str, Snapshot] = {}
        self.state: list[dict[str, Any]] = []
        self.frozen: set[str] = set()

    @initialize(scenario=session_scenarios(), fmt=st.sampled_from(FORMATS), data=st.data())
    def start(self, scenario: Scenario, fmt: str, data: st.DataObject) -> None:
        """Draw the session's options and the parameter held back from the optimizer."""
        self.base = scenario
        names = _trainable(scenario)
        self.names = names
        self.held = data.draw(st.sampled_from(names[::-1]), label="held back")
        self.added = False
        self.twin = Twin(scenario, (self.held,))
        self.segment = Segment(scenario, fmt, (self.held,))

    def _replay(self) -> None:
        world = self.segment.scenario.world_size
        self.state = run(segment_rank, self.segment, world_size=world)

    def _do(self, op: Any) -> None:
        self.segment.ops.append(op)
        if isinstance(op, Step):
            self.twin.step(op, self.segment.scenario.dp_size)
        elif isinstance(op, (Freeze, AddGroup)):
            self.twin.change(op)
        self._replay()

    @rule(step=STEPS)
    def train(self, step: tuple[int, float | None]) -> None:
        """One optimizer step (``micro`` micro-batches, optional clipping)."""
        self._do(Step(self.twin.steps, *step))

    @rule(data=st.data())
    def freeze(self, data: st.DataObject) -> None:
        """Freeze a trainable parameter (after a step it has optimizer state)."""
        free = [n for n in self.names if n not in self.frozen and (n != self.held or self.added)]
        name = data.draw(st.sampled_from(free), label="freeze")
        self.frozen.add(name)
        self._do(Freeze(name))

    @precondition(lambda self: bool(self.frozen))
    @rule(data=st.data())
    def unfreeze(self, data: st.DataObject) -> None:
        """Unfreeze a parameter this session froze."""
        name = data.draw(st.sampled_from(sorted(self.frozen)), label="unfreeze")
        self.frozen.discard(name)
        self._do(Freeze(name, frozen=False))

    @precondition(lambda self: not self.added)
    @rule(lr=st.sampled_from((0.05, 0.2)))
    def add_group(self, lr: float) -> None:
        """``add_param_group`` with the held-back parameter."""
        self.added = True
        self._do(AddGroup(self.held, lr))

    @rule(target=checkpoints, fmt=st.sampled_from(FORMATS))
    def save(self, fmt: str) -> str:
        """Save, full or sharded."""
        name = f"ckpt{len(self.saved)}-{fmt}"
        self.saved[name] = self.twin.snapshot()
        self._do(Save(checkpoint_path(self.root, name, fmt), fmt))
        return name

    @rule(name=checkpoints, strict=st.booleans())
    def load_live(self, name: str, strict: bool) -> None:
        """Load ``name`` into the live objects (when the session's structure is the one
        saved; else into fresh objects of the saved structure, at the same world size)."""
        if self.saved[name][2] != self.twin.structure:
            self._fresh(name, strict, self.segment.scenario)
            return
        self.twin.restore(self.saved[name])
        self._do(Load(checkpoint_path(self.root, name, name.split("-")[1]), strict))

    @rule(name=checkpoints, strict=st.booleans(), world=world_sizes(2), data=st.data())
    def load_fresh(self, name: str, strict: bool, world: int, data: st.DataObject) -> None:
        """Load ``name`` into fresh objects at ``world`` with newly drawn options."""
        drawn = data.draw(load_scenarios(self.base, world), label="load options")
        self._fresh(
            name, strict, dataclasses.replace(drawn, model=self.base.model, optim=self.base.optim)
        )

    def _fresh(self, name: str, strict: bool, scenario: Scenario) -> None:
        snapshot = self.saved[name]
        self.twin.restore(snapshot)
        self.frozen = set(snapshot[2].frozen)
        self.added = bool(snapshot[2].groups)
        source = checkpoint_path(self.root, name, name.split("-")[1])
        self.segment = Segment(
            scenario, self.segment.fmt, (self.held,), snapshot[2], source, strict
        )
        self._replay()

    @rule()
    def rebuild(self) -> None:
        """Tear the strategy down and build it again from a sharded save of its state."""
        self._do(Rebuild(checkpoint_path(self.root, f"rebuild{len(self.segment.ops)}", "sharded")))

    @invariant()
    def tracks_the_plain_twin(self) -> None:
        """Every rank's gathered model and optimizer state equal the twin's (fp32)."""
        if not self.state:
            return
        optim = self.base.optim
        lr = max(optim.max_lr, 0.2)
        tol = tolerance("32-true", optim.kind, lr=lr, steps=max(1, self.twin.steps))
        world = self.segment.scenario.world_size
        for rank, out in enumerate(self.state):
            with clause("TRAIN-4"):
                assert_matches(
                    out, self.twin, tol, what=f"rank {rank} of {world}, {self.twin.steps} steps"
                )

    def teardown(self) -> None:
        """Remove the checkpoints of this example."""
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.mark.skip(
    reason="issue 17 in progress: under ci the reference fails with a parameter held back "
    "from the optimizer and added later (FSDP1's optimizer-state conversion: 'head.bias is not "
    "in the optimizer state'); not yet triaged between the reference and the check"
)
@pytest.mark.clause("TRAIN-4")
def test_training_session_tracks_the_plain_twin() -> None:
    base = settings().max_examples
    run_state_machine_as_test(
        TrainingSession,
        settings=settings(max_examples=max(1, 3 * base // 10), stateful_step_count=6),
    )
