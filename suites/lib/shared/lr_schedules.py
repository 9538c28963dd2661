"""The learning-rate scheduler the checkpoint checks save beside the model (CKPT-SAVE-4).

Every training recipe checkpoints a scheduler with its optimizer, and a load that writes it
but never restores it makes a resumed run start its warmup again. The checks carry torch's
own :class:`~torch.optim.lr_scheduler.LambdaLR` with a linear warmup of
:data:`WARMUP_STEPS` steps (then constant), built over the check's optimizer and saved
under :data:`SCHEDULER_KEY`; :func:`read_scheduler` is what the ranks send back of it, and
:func:`scheduler_difference` what the controller says when two readings differ.

torch's scheduler keeps the counters (``last_epoch``, ``base_lrs``, ``_last_lr``) and sets
each group's ``lr`` when it steps; its ``load_state_dict`` restores the counters only. The
``lr`` a resumed optimizer holds is the one its own state dict saved (the scheduler's value
at the save), so the resumed curve is right when both are restored, in either order.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

__all__ = [
    "SCHEDULER_KEY",
    "WARMUP_STEPS",
    "make_scheduler",
    "read_scheduler",
    "scheduler_difference",
    "step_scheduler",
    "warmup_factor",
]

#: the metadata key the scheduler is saved under
SCHEDULER_KEY = "lr_scheduler"

#: steps of linear warmup: the checks save after 0-2 steps, in the middle of it
WARMUP_STEPS = 4

#: what torch warns when a scheduler steps before its optimizer did (the round trip steps
#: it once per optimizer step already taken, after training: see :func:`step_scheduler`)
_STEP_ORDER_WARNING = re.escape("Detected call of `lr_scheduler.step()` before `optimizer.step()`")


def warmup_factor(epoch: int) -> float:
    """The learning-rate factor after ``epoch`` scheduler steps: ``(epoch + 1) / WARMUP_STEPS``
    up to 1 (never 0, so that the first optimizer step moves the model)."""
    return min(1.0, (epoch + 1) / WARMUP_STEPS)


def make_scheduler(optimizer: Optimizer) -> LambdaLR:
    """The warmup scheduler over ``optimizer`` (it sets each group's ``lr`` to
    ``lr * warmup_factor(0)`` and records the ``lr`` as ``initial_lr``)."""
    return LambdaLR(optimizer, warmup_factor)


def step_scheduler(scheduler: LambdaLR, times: int) -> None:
    """Step ``scheduler`` ``times`` times without optimizer steps in between: a scheduler
    built over an optimizer that has already taken ``times`` steps catches up with it. Its
    state and the groups' ``lr`` are then what stepping alongside the optimizer gives
    (:class:`LambdaLR` computes the rate from ``last_epoch`` alone); torch's warning about
    the order of the calls is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_STEP_ORDER_WARNING, category=UserWarning)
        for _ in range(times):
            scheduler.step()


def read_scheduler(scheduler: Any) -> dict[str, Any]:
    """What a check compares of a scheduler, as plain data: its ``state_dict()``, its
    ``get_last_lr()`` and the ``lr`` of each of its optimizer's groups."""
    return {
        "state": scheduler.state_dict(),
        "last_lr": [float(x) for x in scheduler.get_last_lr()],
        "group_lrs": [float(g["lr"]) for g in scheduler.optimizer.param_groups],
    }


def scheduler_difference(found: dict[str, Any], saved: dict[str, Any]) -> str | None:
    """How a :func:`read_scheduler` reading differs from the saved one (None: it does not):
    the learning rates, then the first entry of the state dict that differs."""
    if found["last_lr"] != saved["last_lr"]:
        return (
            f"last_lr {found['last_lr']} (last_epoch {found['state'].get('last_epoch')}) "
            f"where {saved['last_lr']} (last_epoch {saved['state'].get('last_epoch')}) was saved"
        )
    for key in sorted(set(found["state"]) | set(saved["state"])):
        a, b = found["state"].get(key, "<missing>"), saved["state"].get(key, "<missing>")
        if a != b:
            return f"state_dict()[{key!r}] {a!r} where {b!r} was saved"
    return None
