"""The checks' learning-rate scheduler (:mod:`suites.lib.shared.lr_schedules`), no ranks.

The round trip builds it after training and lets it catch up with the optimizer's steps:
that must leave it, and the optimizer's groups, where stepping alongside leaves them. Its
state dict must pass a ``weights_only`` load (CKPT-SEC-1), and a scheduler left as it was by
a load must be told apart from the saved one, naming the learning rates.
"""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch import nn

from suites.lib.controller.checkpoint_checks import check_scheduler
from suites.lib.shared.lr_schedules import (
    WARMUP_STEPS,
    make_scheduler,
    read_scheduler,
    scheduler_difference,
    step_scheduler,
    warmup_factor,
)
from suites.lib.shared.specs import OptimSpec


def _optimizer(lr: float = 0.1) -> torch.optim.Optimizer:
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    return OptimSpec("adamw", lr=lr, groups="by_kind").build(model.named_parameters())


def test_warmup_rises_linearly_then_holds() -> None:
    factors = [warmup_factor(e) for e in range(WARMUP_STEPS + 2)]
    assert factors[0] > 0, "a first step at rate 0 would not move the model"
    assert factors == sorted(factors) and factors[WARMUP_STEPS - 1 :] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("steps", [0, 1, 2, WARMUP_STEPS + 1])
def test_catching_up_equals_stepping_alongside(steps: int) -> None:
    alongside = _optimizer()
    scheduler = make_scheduler(alongside)
    for _ in range(steps):
        alongside.step()
        scheduler.step()
    late = _optimizer()
    caught_up = make_scheduler(late)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the order warning is silenced, nothing else raised
        step_scheduler(caught_up, steps)
    assert read_scheduler(caught_up) == read_scheduler(scheduler)
    lrs = [g["lr"] for g in late.param_groups]
    assert lrs == [0.1 * warmup_factor(steps), 0.05 * warmup_factor(steps)]


def test_state_dict_loads_without_unpickling_code() -> None:
    scheduler = make_scheduler(_optimizer())
    step_scheduler(scheduler, 2)
    buffer = io.BytesIO()
    torch.save(scheduler.state_dict(), buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == scheduler.state_dict()


def test_a_scheduler_left_as_it_was_is_told_apart() -> None:
    saved = make_scheduler(_optimizer())
    step_scheduler(saved, 2)
    left = make_scheduler(_optimizer(lr=0.2))  # a fresh one, as a load that skipped it leaves
    found = scheduler_difference(read_scheduler(left), read_scheduler(saved))
    assert found is not None and "last_epoch 0" in found and "last_epoch 2" in found
    reading = {"saved": read_scheduler(saved), "loaded": read_scheduler(left)}
    with pytest.raises(AssertionError, match=r"^CKPT-SAVE-4: here: after the load, .*last_lr"):
        check_scheduler({**reading, "replaced_by": None}, where="here")
    with pytest.raises(AssertionError, match=r"^CKPT-SAVE-4: here: .* replaced by a dict"):
        check_scheduler({**reading, "replaced_by": "dict"}, where="here")
    restored = make_scheduler(_optimizer(lr=0.2))
    restored.load_state_dict(saved.state_dict())
    check_scheduler(
        {"saved": read_scheduler(saved), "loaded": read_scheduler(restored), "replaced_by": None},
        where="here",
    )
