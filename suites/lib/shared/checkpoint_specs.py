"""Checkpoint plans as data, and the user metadata saved beside the model.

A :class:`CkptPlan` is drawn in the controller (:mod:`suites.lib.controller.checkpoint_plans`)
and sent to the ranks: the scenario that trains and saves (world size A), the format, the
scenario that loads (world size B, possibly the other family, a fresh seed and learning rate
so that a loader that does nothing is caught), and the user metadata saved beside the model
(ints, tensors, nested containers, an object with ``state_dict``/``load_state_dict``), part of
it requested on load. The ranks build the metadata with :func:`make_metadata`; the controller
compares what came back with :func:`plain_metadata` of the same. :class:`ReorderedOptim` is
an optimizer spec for the interop tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer

from suites.lib.shared.specs import OptimSpec, Scenario

__all__ = [
    "FORMATS",
    "META_KEYS",
    "META_KINDS",
    "ROUND_TRIP",
    "CkptPlan",
    "Counter",
    "ReorderedOptim",
    "fresh_metadata",
    "make_metadata",
    "plain_metadata",
]

FORMATS = ("full", "sharded")
#: the clause of a save then load in each format at one world size (CONTRACT.md CKPT-RT-1/2):
#: the method a check looks through when it loads a checkpoint to see what a save wrote
ROUND_TRIP = {"full": "CKPT-RT-1", "sharded": "CKPT-RT-2"}


META_KINDS = ("stateful", "nested", "tensor", "int")


#: metadata kind -> the key it is saved under
META_KEYS = {"int": "step", "tensor": "rng", "nested": "nested", "stateful": "counter"}


class Counter:
    """User metadata with ``state_dict``/``load_state_dict`` (saved through them)."""

    def __init__(self, n: int = 0) -> None:
        self.n = n
        self.history = torch.arange(float(n))

    def state_dict(self) -> dict[str, Any]:
        """``{"n": int, "history": tensor}``."""
        return {"n": self.n, "history": self.history.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``n`` and ``history``."""
        self.n, self.history = int(state["n"]), state["history"].clone()


def make_metadata(kinds: tuple[str, ...]) -> dict[str, Any]:
    """The metadata a plan saves: one entry per kind (key ``META_KEYS[kind]``)."""
    values = {
        "int": 7,
        "tensor": torch.arange(4.0) * 0.5,
        "nested": {"epoch": 3, "lrs": [0.1, 0.05], "name": "run-1", "t": {"m": torch.ones(2, 3)}},
        "stateful": Counter(5),
    }
    return {META_KEYS[k]: values[k] for k in kinds}


def fresh_metadata(keys: tuple[str, ...]) -> dict[str, Any]:
    """Values of the requested metadata keys before a load (all different from the saved)."""
    values = {"step": -1, "rng": torch.zeros(4), "nested": {"old": True}, "counter": Counter(0)}
    return {k: values[k] for k in keys}


def plain_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """Metadata as data: a stateful object becomes its ``state_dict()``."""
    return {k: v.state_dict() if isinstance(v, Counter) else v for k, v in meta.items()}


@dataclass(frozen=True)
class CkptPlan:
    """One checkpoint round trip, as data.

    Args:
        save: the scenario that trains ``save.plan.steps`` steps (0: never stepped) and saves.
        fmt: ``full`` or ``sharded``.
        load: the scenario that loads (its world size, family and strategy options; a fresh
            seed and learning rate so that a loader that does nothing is caught).
        meta: kinds of user metadata saved beside the model.
        requested: the metadata keys requested on load (the rest must be returned).
        moments: the moments (:data:`suites.lib.shared.axes.MOMENTS`) its job saves at, as
            the coverage's ``moment`` axis reports them: given by the checks of the clauses
            whose scope names the axis (empty: not reported).
    """

    save: Scenario
    fmt: str
    load: Scenario
    meta: tuple[str, ...] = ("int",)
    requested: tuple[str, ...] = ("step",)
    moments: tuple[str, ...] = ()

    @property
    def saved_at(self) -> str:
        """``"saved at world size A (family, format)"`` for failure messages about the save."""
        return f"saved at world size {self.save.world_size} ({self.save.family}, {self.fmt})"

    @property
    def worlds(self) -> str:
        """``"save at world size A, load at world size B"`` for failure messages."""
        return (
            f"saved at world size {self.save.world_size} ({self.save.family}, {self.fmt}), "
            f"loaded at world size {self.load.world_size} ({self.load.family})"
        )


@dataclass(frozen=True)
class ReorderedOptim(OptimSpec):
    """An :class:`~suites.lib.shared.specs.OptimSpec` whose groups come in reverse order, each
    group's parameters reversed too: integer ids in ``param_groups`` order then differ from
    ``model.parameters()`` order (CKPT-REKEY-1)."""

    def build(self, named_params: Iterable[tuple[str, torch.nn.Parameter]]) -> Optimizer:
        """The reordered optimizer over ``named_params``."""
        opt = super().build(named_params)
        groups = [{**g, "params": list(reversed(g["params"]))} for g in reversed(opt.param_groups)]
        cls: Any = type(opt)
        reordered: Optimizer = cls(groups[0]["params"])  # then the groups exactly as built
        reordered.param_groups.clear()
        for group in groups:
            reordered.add_param_group(group)
        return reordered
