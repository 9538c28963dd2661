"""The arguments of the contract's methods as axes: what the suites pass, and what a job reports.

The contract declares each argument of a :class:`harness.contract.Strategy` method that takes
more than one legal value, with those values (:data:`harness.clauses.ARGUMENTS`:
``clip_gradients_norm``'s ``norm_type`` 2, 1, inf and 1.5, ``load_checkpoint``'s ``strict``,
...), and a clause's scope names those it speaks of. This module is the suites' side of it:

- :func:`arguments` writes the values a job passed as a coverage entry
  (``{"norm_type": ("inf",)}``), as :func:`argument_value` writes each value;
- :func:`passes` declares, on a rank job, the argument values it passes as a function of the
  job's own arguments; the controller's dispatch reports them beside the job's configuration
  axes (:func:`passed_by`), so the coverage table lists ``norm_type=inf`` under CLIP-1;
- :func:`plan_arguments` is what a training plan passes (:func:`suites.lib.ranks.training.train`);
- :data:`DRAWN` are the arguments a :class:`~suites.lib.shared.specs.Scenario` carries, so a
  check draws them with its configuration: :func:`with_arguments` sets them and
  :func:`carried_arguments` reads them back. Every other argument is passed with each of its
  values by every job of the clause that owns it (``strict``, ``filter``, ``reduce_op``, ...).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from harness.clauses import ARGUMENTS
from suites.lib.shared.specs import Scenario

__all__ = [
    "DECLARED",
    "DRAWN",
    "argument_value",
    "arguments",
    "carried_arguments",
    "passed_by",
    "passes",
    "plan_arguments",
    "with_arguments",
]

F = TypeVar("F", bound=Callable[..., Any])

#: ``{argument: its legal values}``, as the contract declares them
DECLARED: dict[str, tuple[str, ...]] = {a.name: a.values for a in ARGUMENTS}

#: the arguments a scenario carries (the others are passed by construction)
DRAWN = ("norm_type", "error_if_nonfinite", "empty_init")

#: what each rank job passes, by job (see :func:`passes`)
_PASSES: dict[Callable[..., Any], Callable[..., Mapping[str, tuple[str, ...]]]] = {}


def argument_value(name: str, value: Any) -> str:
    """How the coverage table writes ``value`` passed as argument ``name``: ``None``, bools
    and strings as they are, numbers without a needless ``.0`` (``2``, ``1.5``, ``inf``), a
    ``src`` other than 0 as ``non-zero``, and any object but ``None`` of ``filter`` or
    ``storage_options`` as ``given``.

    Raises:
        KeyError: ``name`` is not an argument the contract declares.
    """
    if name not in DECLARED:
        raise KeyError(f"{name!r} is not an argument of the contract; declared: {sorted(DECLARED)}")
    if value is None or isinstance(value, (bool, str)):
        return str(value)
    if name in ("filter", "storage_options"):
        return "given"
    if name == "src":
        return "0" if value == 0 else "non-zero"
    number = float(value)
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return str(int(number)) if number.is_integer() else repr(number)


def arguments(**passed: Iterable[Any] | Any) -> dict[str, tuple[str, ...]]:
    """A coverage entry of the values passed, each argument's values in a tuple (or one
    value): ``arguments(norm_type=(2.0, math.inf))`` is ``{"norm_type": ("2", "inf")}``."""
    entry: dict[str, tuple[str, ...]] = {}
    for name, values in passed.items():
        many = values if isinstance(values, (tuple, list, set, frozenset)) else (values,)
        entry[name] = tuple(dict.fromkeys(argument_value(name, v) for v in many))
    return entry


def passes(of: Callable[..., Mapping[str, tuple[str, ...]]]) -> Callable[[F], F]:
    """Declare what a rank job passes: ``of`` takes the job's arguments (all but ``ctx``) and
    gives :func:`arguments` of the values the job passes to the contract's methods."""

    def declare(job: F) -> F:
        _PASSES[job] = of
        return job

    return declare


def passed_by(job: Callable[..., Any], args: tuple[Any, ...]) -> dict[str, tuple[str, ...]]:
    """The argument values ``job`` passes when sent ``args`` (empty for a job that declares
    none)."""
    of = _PASSES.get(job)
    return dict(of(*args)) if of is not None else {}


def plan_arguments(scenario: Scenario) -> dict[str, tuple[str, ...]]:
    """What training ``scenario``'s plan passes: ``empty_init`` to ``module_init_context``,
    ``enabled`` to ``no_backward_sync`` (True for all micro-batches of a step but the last),
    and, when it clips, ``norm_type`` and ``error_if_nonfinite``."""
    plan = scenario.plan
    passed: dict[str, Any] = {
        "empty_init": scenario.empty_init,
        "enabled": (True, False) if plan.micro_batches > 1 else False,
    }
    if plan.clip is not None:
        passed["norm_type"] = plan.norm_type
        passed["error_if_nonfinite"] = plan.error_if_nonfinite
    return arguments(**passed)


def carried_arguments(scenario: Scenario) -> dict[str, str]:
    """The value of each argument of :data:`DRAWN` that ``scenario`` carries."""
    plan = scenario.plan
    return {
        "norm_type": argument_value("norm_type", plan.norm_type),
        "error_if_nonfinite": argument_value("error_if_nonfinite", plan.error_if_nonfinite),
        "empty_init": argument_value("empty_init", scenario.empty_init),
    }


def with_arguments(scenario: Scenario, row: Mapping[str, str]) -> Scenario:
    """``scenario`` carrying the argument values of ``row`` (as :func:`argument_value` writes
    them).

    Raises:
        ValueError: an argument a scenario does not carry (not in :data:`DRAWN`), or a value
            it cannot take (``empty_init=None``: a scenario's is a bool).
    """
    plan, empty_init = scenario.plan, scenario.empty_init
    for name, value in row.items():
        if name == "norm_type":
            plan = dataclasses.replace(plan, norm_type=float(value))
        elif name == "error_if_nonfinite":
            plan = dataclasses.replace(plan, error_if_nonfinite=value == "True")
        elif name == "empty_init" and value in ("True", "False"):
            empty_init = value == "True"
        else:
            raise ValueError(
                f"with_arguments: a scenario cannot carry {name}={value}; it carries "
                f"{', '.join(DRAWN)} (empty_init as a bool)"
            )
    return dataclasses.replace(scenario, plan=plan, empty_init=empty_init)
