"""The plug-in contract between shardcheck and a strategy under test.

A *strategy factory* is a callable ``factory(spec: StrategySpec) -> Strategy``. The harness
builds the spec on every rank, inside a job (so it may hold callables, classes and device
meshes), and calls the factory there. A factory that cannot honour the spec raises
:class:`Unsupported`; the report then shows ``unsupported: option=value (reason)``.

:class:`Strategy` is the surface the suites call on what the factory returns, as a
``typing.Protocol``: a strategy conforms by having these members, not by subclassing anything.
It lists what the suites use and nothing more, so that mypy flags a suite calling anything
else; the behaviour each member owes is in ``CONTRACT.md`` (the API-* clauses).

The field names and defaults of :class:`StrategySpec` are fixed (they are the reference
strategies' constructor argument names; the README's "Validate your strategy" shows a
factory of each family reading them): third parties code against them.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from harness.entry.defaults import DEFAULT_FACTORY
from harness.refusals import Refusal

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "DEFAULT_FACTORY",
    "FAMILIES",
    "PRECISIONS",
    "MeshStrategy",
    "Strategy",
    "StrategyFactory",
    "StrategyFactoryError",
    "StrategyPrecision",
    "StrategySpec",
    "Unsupported",
    "load_factory",
    "parse_strategy_options",
    "short_value",
    "spec_field_names",
]

FAMILIES = ("fsdp", "model_parallel", "fsdp2")
PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")


@dataclass(frozen=True)
class StrategySpec:
    """Everything a factory needs to build the strategy for one rank.

    Fields of the ``fsdp`` family use the names of the FSDPStrategy constructor, those of
    the ``model_parallel`` family the names of the ModelParallelStrategy constructor;
    ``extra`` carries everything else (``--strategy-option KEY=VALUE`` lands here too).

    The three families:

    - ``fsdp``: the strategy wraps the model in FSDP1 (``FullyShardedDataParallel``) units.
    - ``model_parallel``: the strategy builds a ``data_parallel`` x ``tensor_parallel`` mesh
      and hands it with the model to the suite's ``parallelize_fn``, which shards.
    - ``fsdp2``: the strategy calls FSDP2's ``fully_shard`` itself, on each module its wrap
      policy picks and on the root, with its own ``reshard_after_forward``, mixed-precision
      policy, offload policy and mesh (1-D, or 2-D ``(replicate, shard)`` for HSDP). Named
      after the name torch's documentation and the libraries that offer it use for
      ``fully_shard`` (accelerate's and the transformers Trainer's ``fsdp_version: 2``), so
      an author finds it by the name of what their strategy calls. It reads the fields the
      ``fsdp`` family has where they mean the same (``auto_wrap_policy``,
      ``activation_checkpointing_policy``, ``state_dict_type``, ``cpu_offload``,
      ``device_mesh``) and adds ``reshard_after_forward``.
    """

    family: Literal["fsdp", "model_parallel", "fsdp2"]
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
    # fsdp2 family: the fields above where they mean the same (for fsdp2 an auto_wrap_policy
    # is a set of classes or a callable fn(module) -> bool, cpu_offload a bool or an FSDP2
    # OffloadPolicy, device_mesh (replicate, shard) asks for HSDP), and fully_shard's own:
    reshard_after_forward: bool | int = True
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


_T = TypeVar("_T")


class StrategyPrecision(Protocol):
    """The part of a strategy's precision plugin the suites use (API-4)."""

    def forward_context(self) -> AbstractContextManager[Any]:
        """A context the suites run the forward pass and the loss in."""

    def convert_input(self, data: Any) -> Any:
        """``data`` (a tensor of a batch) in the dtype the set-up module expects as input."""


class Strategy(Protocol):
    """What the suites call on the object a factory returns: one strategy of one rank.

    Every member here is used by some suite; the clause in parentheses is where
    ``CONTRACT.md`` says what it must do. A member a suite needs only for one family is not
    here (see :class:`MeshStrategy`).
    """

    @property
    def root_device(self) -> torch.device:
        """This rank's device: where the suites put inputs and targets (API-6)."""

    @property
    def precision(self) -> StrategyPrecision:
        """The precision plugin; the suites run forwards through it (API-4)."""

    @property
    def distributed_sampler_kwargs(self) -> Mapping[str, int]:
        """``num_replicas`` and ``rank`` of the data-parallel dimension; the suites pick each
        rank's batches by ``rank`` (API-6)."""

    @property
    def checkpoint_io(self) -> Any:
        """Not supported: the suites expect reading it to raise ``NotImplementedError``
        (API-7), so its type is nothing they rely on."""

    @checkpoint_io.setter
    def checkpoint_io(self, value: Any) -> None:
        """Not supported: the suites expect assigning any object to raise
        ``NotImplementedError`` (API-7)."""

    def setup_environment(self) -> None:
        """Join the default process group the harness already created, without creating or
        destroying one (API-1); the suites call it right after the factory."""

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """A context the suites build the model in; ``empty_init=True`` may leave it on the
        meta device for ``setup_module`` to materialize (API-3)."""

    def setup_module(self, module: nn.Module) -> nn.Module:
        """The sharded module the suites then train, save and load (API-2)."""

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """The optimizer to step, built from the set-up module's parameters; one that holds
        none of them is refused with ``ValueError`` (API-2)."""

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer]
    ) -> tuple[nn.Module, list[Optimizer]]:
        """``(module, [optimizers])`` set up together (API-2; fsdp with ``use_orig_params``)."""

    def backward(self, tensor: Tensor, module: nn.Module | None) -> None:
        """Backward of the loss ``tensor`` through the precision plugin (API-4)."""

    def optimizer_step(self, optimizer: Optimizer) -> Any:
        """One step of ``optimizer`` through the precision plugin (API-4); the suites ignore
        what it returns."""

    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Scale the gradients to a global norm of at most ``max_norm`` and return that norm,
        the same on every rank (CLIP-1)."""

    def no_backward_sync(self, module: nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        """A context that skips the gradient reduction when ``enabled`` and is a no-op when
        not (SYNC-1); the suites accumulate micro-batches under it."""

    def all_reduce(self, tensor: _T, group: Any | None = None, reduce_op: str = "mean") -> _T:
        """``tensor`` reduced over the world with ``reduce_op`` (``"mean"`` or ``"sum"``, by
        keyword); anything that is not a tensor comes back as it came (API-5)."""

    def broadcast(self, obj: _T, src: int = 0) -> _T:
        """Rank ``src``'s picklable ``obj``, on every rank (API-5)."""

    def barrier(self, name: str | None = None) -> None:
        """Return once every rank has called it (API-5)."""

    def save_checkpoint(
        self,
        path: str,
        state: dict[str, Any],
        storage_options: Any = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        """Save the set-up module, optimizers (or lists of them) and plain values of ``state``
        to ``path``; ``storage_options`` other than ``None`` is refused (CKPT-*)."""

    def load_checkpoint(
        self,
        path: str,
        state: dict[str, Any] | nn.Module | Optimizer | None = None,
        strict: bool = True,
    ) -> dict[str, Any]:
        """Restore the objects in ``state`` in place (a bare module: from a file of its state
        dict) and return the saved entries that ``state`` did not ask for (CKPT-*)."""

    def teardown(self) -> None:
        """Release what the strategy holds; the harness's process group stays usable (API-8)."""


class MeshStrategy(Strategy, Protocol):
    """A strategy of the ``model_parallel`` family: :class:`Strategy` and its device mesh."""

    @property
    def device_mesh(self) -> DeviceMesh:
        """The ``data_parallel`` x ``tensor_parallel`` mesh, built by ``setup_environment``;
        reading it before then raises ``RuntimeError`` (MP-1, API-6)."""


#: What ``--strategy`` names: a callable building this rank's strategy from the spec.
StrategyFactory = Callable[[StrategySpec], Strategy]


class Unsupported(Refusal):
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

    outcome = "unsupported"

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


def load_factory(target: str) -> StrategyFactory:
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
