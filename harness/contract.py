"""The plug-in contract between shardcheck and a strategy under test.

A *strategy factory* is a callable ``factory(spec: StrategySpec) -> strategy``. The harness
builds the spec on every rank, inside a job (so it may hold callables, classes and device
meshes), and calls the factory there. A factory that cannot honour the spec raises
:class:`Unsupported`; the report then shows ``unsupported: option=value (reason)``.

The field names and defaults of :class:`StrategySpec` are fixed by the design
(``DESIGN.md``, "The contract for third-party strategies"): third parties code against them.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

__all__ = [
    "DEFAULT_FACTORY",
    "FAMILIES",
    "PRECISIONS",
    "StrategyFactoryError",
    "StrategySpec",
    "Unsupported",
    "load_factory",
    "parse_strategy_options",
    "short_value",
    "spec_field_names",
]

DEFAULT_FACTORY = "reference_impl:make_strategy"
FAMILIES = ("fsdp", "model_parallel")
PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")


@dataclass(frozen=True)
class StrategySpec:
    """Everything a factory needs to build the strategy for one rank.

    Fields of the ``fsdp`` family use the names of the FSDPStrategy constructor, those of
    the ``model_parallel`` family the names of the ModelParallelStrategy constructor;
    ``extra`` carries everything else (``--strategy-option KEY=VALUE`` lands here too).
    """

    family: Literal["fsdp", "model_parallel"]
    rank: int
    world_size: int
    device: torch.device
    precision: str = "32-true"  # "32-true" | "16-true" | "bf16-true" | "16-mixed" | "bf16-mixed"
    # fsdp family: the FSDPStrategy constructor's names
    sharding_strategy: str = "FULL_SHARD"
    auto_wrap_policy: Any = None  # set of classes | policy object | callable | None
    activation_checkpointing_policy: Any = None
    state_dict_type: Literal["full", "sharded"] = "sharded"
    cpu_offload: bool = False
    device_mesh: tuple[int, int] | None = None  # (replicate, shard) for hybrid sharding
    # model_parallel family: the ModelParallelStrategy constructor's names
    parallelize_fn: Callable | None = None
    data_parallel_size: int | Literal["auto"] = "auto"
    tensor_parallel_size: int | Literal["auto"] = "auto"
    save_distributed_checkpoint: bool = True
    # anything else the strategy takes (use_orig_params, activation_checkpointing, timeout, ...)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(
                f"StrategySpec.family={self.family!r} is not a known family; "
                f"use one of {', '.join(FAMILIES)}."
            )


def spec_field_names() -> frozenset[str]:
    """Names of the StrategySpec fields a test may set through ``ctx.make_strategy``."""
    return frozenset(f.name for f in dataclasses.fields(StrategySpec))


class Unsupported(Exception):
    """Raised by a strategy factory (or a strategy) for a configuration it does not support.

    Args:
        reason: why the configuration is not supported, in words a user can act on.
        option: the name of the option that cannot be honoured (e.g. ``"sharding_strategy"``).
        value: the value of that option.
    """

    def __init__(self, reason: str, option: str | None = None, value: Any = None) -> None:
        super().__init__(reason, option, value)
        self.reason = reason
        self.option = option
        self.value = value

    def describe(self) -> str:
        """The report's wording: ``unsupported: option=value (reason)``."""
        if self.option is None:
            return f"unsupported: {self.reason}"
        return f"unsupported: {self.option}={_short(self.value)} ({self.reason})"

    def __str__(self) -> str:
        return self.describe()

    def __reduce__(self) -> tuple[Any, ...]:
        # The value may be unpicklable (a class, a mesh): ship its readable form instead.
        return (type(self), (self.reason, self.option, _short(self.value)))


def short_value(value: Any) -> str:
    """A value's readable form, as ``Unsupported`` reports (and pickles) it."""
    return _short(value)


def _short(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, type):
        return value.__qualname__
    if isinstance(value, (set, frozenset, list, tuple)):
        inner = ", ".join(sorted(_short(v) for v in value))
        return "{" + inner + "}"
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    return str(name) if name else repr(value)


class StrategyFactoryError(Exception):
    """The ``--strategy`` value cannot be used: bad syntax, import error, wrong signature."""


def load_factory(target: str) -> Callable[[StrategySpec], Any]:
    """Resolve ``"module:callable"`` to the factory and check it takes one argument.

    Raises:
        StrategyFactoryError: with a message naming the value and what to do.
    """
    module_name, sep, qualname = target.partition(":")
    if not sep or not module_name or not qualname:
        raise StrategyFactoryError(
            f"--strategy={target!r} is not of the form MODULE:CALLABLE "
            f"(for example {DEFAULT_FACTORY!r})."
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise StrategyFactoryError(
            f"--strategy={target!r}: module {module_name!r} could not be imported "
            f"({type(exc).__name__}: {exc}). Check that it is installed or on PYTHONPATH."
        ) from exc
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise StrategyFactoryError(
                f"--strategy={target!r}: module {module_name!r} has no attribute {qualname!r}."
            ) from exc
    if not callable(obj):
        raise StrategyFactoryError(
            f"--strategy={target!r} names {type(obj).__name__} object, not a callable."
        )
    try:
        inspect.signature(obj).bind(object())
    except TypeError as exc:
        raise StrategyFactoryError(
            f"--strategy={target!r}: the factory must take exactly one argument "
            f"(a harness.StrategySpec), but its signature is {inspect.signature(obj)}."
        ) from exc
    except ValueError:  # builtins without a signature: accept, they fail loudly later
        pass
    return obj


def parse_strategy_options(items: list[str] | None) -> dict[str, Any]:
    """Parse repeated ``--strategy-option KEY=VALUE`` into a dict.

    Values are read as Python literals where they parse (``True``, ``2``, ``"x"``, ``[1, 2]``)
    and kept as strings otherwise.
    """
    import ast

    options: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise StrategyFactoryError(
                f"--strategy-option {item!r} is not of the form KEY=VALUE with KEY an identifier "
                "(for example --strategy-option use_orig_params=False)."
            )
        try:
            value: Any = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        options[key] = value
    return options
