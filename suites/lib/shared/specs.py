"""Scenario dataclasses: frozen, picklable, readable; built into real objects on the ranks.

A scenario holds only data (names, numbers, tuples), never policy objects, classes or
callables, so its repr is a reproducer and it crosses process boundaries by pickle. Each
``build()`` turns the data into the object a strategy takes (a wrap policy, an optimizer,
a ``parallelize_fn``), on the rank that needs it.

[Note: what a policy of classes selects] A spec names zoo classes; on the ranks
:func:`~suites.lib.shared.models.module_class` resolves each name to the zoo's class object
(``Block`` is the zoo's ``Block``, never :class:`suites.lib.shared.lookalike.Block`). WRAP-1,
FSDP2-1 and AC-1 say that a policy of classes (``classes``, ``module_wrap_policy``) selects
"each instance of those classes": ``isinstance``, so an instance of a subclass of a listed
class is selected and a module of another class that merely shares a listed class's name is
not. Those kinds' oracles (:meth:`WrapSpec.expected_units`, :meth:`ACSpec.expected_wrapped`)
are the instances of the resolved classes. A callable policy decides for itself (the contract:
"the modules the policy picks"), so the callables the specs build say what they pick: every
instance of the resolved classes too (:func:`select_by_class`), and those kinds' oracles ask
the built callable itself, module by module (``custom_policy``, ``module_fn``) or through
FSDP1's recursion (``callable``, ``size``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from suites.lib.shared.models import ModelSpec, clean_name, module_class
from suites.lib.shared.parallelize import parallelize_zoo

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "ACSpec",
    "FSDP2Config",
    "FSDPConfig",
    "MPConfig",
    "OptimSpec",
    "Scenario",
    "StrategyConfig",
    "TrainPlan",
    "WrapSpec",
    "select_by_class",
]

WRAP_KINDS = (
    "none",
    "classes",
    "module_wrap_policy",
    "custom_policy",
    "size",
    "callable",
    "module_fn",
)
AC_KINDS = ("none", "classes", "module_wrap_policy", "callable")


def select_by_class(
    module: nn.Module, recurse: bool, nonwrapped_numel: int, *, classes: tuple[str, ...]
) -> bool:
    """A callable wrap policy (FSDP1's ``(module, recurse, nonwrapped_numel)`` form) that
    picks every instance of the zoo classes named ``classes`` (see [Note: what a policy of
    classes selects])."""
    del nonwrapped_numel
    return True if recurse else _lambda_by_class(module, classes=classes)


def _lambda_by_class(module: nn.Module, *, classes: tuple[str, ...]) -> bool:
    """Whether ``module`` is an instance of a zoo class named in ``classes`` (a subclass's
    instance too; another module's class of the same name not)."""
    return isinstance(module, tuple(_classes(classes)))


def _size_policy(
    module: nn.Module, recurse: bool, nonwrapped_numel: int, *, min_num_params: int
) -> bool:
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    return size_based_auto_wrap_policy(
        module, recurse, nonwrapped_numel, min_num_params=min_num_params
    )


def _classes(names: tuple[str, ...]) -> set[type[nn.Module]]:
    return {module_class(n) for n in names}


def _instances(model: nn.Module, classes: tuple[str, ...]) -> set[str]:
    """Qualified names of ``model``'s modules (the root left out) that are instances of the
    zoo classes named ``classes``."""
    return {n for n, m in model.named_modules() if n and _lambda_by_class(m, classes=classes)}


def _simulate_recursive(module: nn.Module, policy: Any, prefix: str, out: set[str]) -> int:
    """Which modules FSDP1's recursive auto-wrap wraps (mirrors torch's walk, by name)."""
    numel = sum(p.numel() for p in module.parameters())
    if not policy(module=module, recurse=True, nonwrapped_numel=numel):
        return 0
    wrapped = 0
    for name, child in module.named_children():
        wrapped += _simulate_recursive(child, policy, f"{prefix}{name}.", out)
    if prefix and policy(module=module, recurse=False, nonwrapped_numel=numel - wrapped):
        out.add(prefix[:-1])
        return numel
    return wrapped


def _build_policy(
    owner: str,
    kinds: tuple[str, ...],
    kind: str,
    classes: tuple[str, ...],
    min_num_params: int = 0,
) -> Any:
    """The policy object of ``kind`` (None for ``none``) for a wrap or checkpointing spec.

    Raises:
        ValueError: ``kind`` is not one of ``kinds`` (``owner`` names the spec).
    """
    from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy

    if kind not in kinds:
        raise ValueError(f"{owner}.kind={kind!r} is unknown; use one of {kinds}.")
    if kind == "none":
        return None
    if kind == "classes":
        return _classes(classes)
    if kind == "module_wrap_policy":
        return ModuleWrapPolicy(_classes(classes))
    if kind == "custom_policy":
        return CustomPolicy(functools.partial(_lambda_by_class, classes=classes))
    if kind == "size":
        return functools.partial(_size_policy, min_num_params=min_num_params)
    if kind == "module_fn":  # FSDP2's form: fn(module) -> bool
        return functools.partial(_lambda_by_class, classes=classes)
    return functools.partial(select_by_class, classes=classes)  # "callable"


@dataclass(frozen=True)
class WrapSpec:
    """An auto-wrap policy as data (FSDP1's, and the fsdp2 family's).

    Args:
        kind: ``none``; ``classes`` (a set of classes); ``module_wrap_policy`` /
            ``custom_policy`` (policy objects); ``size`` (size-based, ``min_num_params``);
            ``callable`` (a ``(module, recurse, nonwrapped_numel)`` function that picks the
            instances of ``classes``); ``module_fn`` (a ``fn(module) -> bool`` that picks them:
            FSDP2's form). See [Note: what a policy of classes selects].
        classes: zoo class names for the class-based kinds (resolved by
            :func:`~suites.lib.shared.models.module_class`).
        min_num_params: threshold of the size-based policy.
    """

    kind: str = "none"
    classes: tuple[str, ...] = ()
    min_num_params: int = 0

    def build(self) -> Any:
        """The policy object the strategy gets (None for ``none``)."""
        return _build_policy("WrapSpec", WRAP_KINDS, self.kind, self.classes, self.min_num_params)

    def expected_units(self, model: nn.Module) -> set[str]:
        """Qualified names of the modules that must be their own FSDP unit (root excluded):
        for a policy of classes, every instance of them (WRAP-1, FSDP2-1); for a callable,
        the modules it picks, through FSDP1's recursion for the ``(module, recurse,
        nonwrapped_numel)`` form."""
        if self.kind == "none":
            return set()
        if self.kind in ("size", "callable"):
            out: set[str] = set()
            _simulate_recursive(model, self.build(), "", out)
            return out
        if self.kind in ("custom_policy", "module_fn"):  # the callable picks, module by module
            pick = functools.partial(_lambda_by_class, classes=self.classes)
            return {n for n, m in model.named_modules() if n and pick(m)}
        return _instances(model, self.classes)


@dataclass(frozen=True)
class ACSpec:
    """An activation-checkpointing policy as data (kinds as :class:`WrapSpec`)."""

    kind: str = "none"
    classes: tuple[str, ...] = ()

    def build(self) -> Any:
        """The policy object the strategy gets (None for ``none``)."""
        return _build_policy("ACSpec", AC_KINDS, self.kind, self.classes)

    def expected_wrapped(self, model: nn.Module) -> set[str]:
        """Qualified names of the modules that must be checkpoint-wrapped: those the policy
        selects (every instance of the classes; for the ``callable`` kind those it picks
        through FSDP1's recursion) but for one inside another selected module: AC-1 allows no
        checkpoint wrapper inside another, so of nested selected modules only the outermost
        is wrapped."""
        if self.kind == "none":
            return set()
        selected: set[str] = set()
        if self.kind == "callable":
            _simulate_recursive(model, self.build(), "", selected)
        else:
            selected = _instances(model, self.classes)
        return {n for n in selected if not any(n.startswith(f"{o}.") for o in selected)}


def _group_of(name: str, rule: str) -> int:
    if rule == "by_kind":  # matrices vs vectors (biases, norms, gate): the usual decay split
        return 0 if name.endswith("weight") and "norm" not in name else 1
    if rule == "by_depth":  # the trunk vs the rest
        return 0 if name.startswith("blocks.") else 1
    return 0


@dataclass(frozen=True)
class OptimSpec:
    """An optimizer with one or several parameter groups.

    Args:
        kind: ``sgd`` (with momentum), ``adam`` or ``adamw``.
        lr: learning rate of group 0; group ``i`` uses ``lr * lr_scales[i]``.
        groups: ``one``, ``by_kind`` (weights / other) or ``by_depth`` (blocks / other).
        momentum: SGD momentum.
        eps: Adam(W) eps: 1e-4, for fp16 (1e-8 rounds to 0 there) and for an attention's key bias
            (see ``tolerances._FP32_ADAM``).
        weight_decay: AdamW weight decay of group 0 (other groups: 0).
        lr_scales: per-group learning-rate factors.
    """

    kind: str = "sgd"
    lr: float = 0.1
    groups: str = "one"
    momentum: float = 0.9
    eps: float = 1e-4
    weight_decay: float = 0.0
    lr_scales: tuple[float, ...] = (1.0, 0.5)

    @property
    def max_lr(self) -> float:
        """The largest learning rate of any group."""
        return self.lr * max(self.lr_scales)

    def build(self, named_params: Iterable[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer:
        """The optimizer over ``named_params`` (wrapper prefixes in names are ignored)."""
        buckets: dict[int, list[nn.Parameter]] = {}
        for name, param in named_params:
            buckets.setdefault(_group_of(clean_name(name), self.groups), []).append(param)
        groups = []
        for index in sorted(buckets):
            group: dict[str, Any] = {"params": buckets[index]}
            group["lr"] = self.lr * self.lr_scales[index % len(self.lr_scales)]
            if self.kind == "adamw":
                group["weight_decay"] = self.weight_decay if index == 0 else 0.0
            groups.append(group)
        if self.kind == "sgd":
            return torch.optim.SGD(groups, lr=self.lr, momentum=self.momentum)
        if self.kind == "adam":
            return torch.optim.Adam(groups, lr=self.lr, eps=self.eps)
        if self.kind == "adamw":
            return torch.optim.AdamW(groups, lr=self.lr, eps=self.eps)
        raise ValueError(f"OptimSpec.kind={self.kind!r} is unknown; use sgd, adam or adamw.")


@dataclass(frozen=True)
class TrainPlan:
    """What one training run does.

    Args:
        steps: optimizer steps.
        micro_batches: micro-batches per step; all but the last run under
            ``no_backward_sync(module, enabled=True)``.
        batch_size: rows per micro-batch per data-parallel rank.
        clip: ``max_norm`` for ``clip_gradients_norm`` before each step, or None.
        data_seed: seeds the batches.
        loss_scale: the loss is ``mse * loss_scale`` (< 1 under ``16-mixed``, so that the
            grad scaler's initial 65536 does not overflow fp16 on the first steps and skip
            them, which the reference would not).
        norm_type: ``clip_gradients_norm``'s ``norm_type`` when clipping (``math.inf``: the
            max norm).
        error_if_nonfinite: ``clip_gradients_norm``'s ``error_if_nonfinite`` when clipping.
    """

    steps: int = 2
    micro_batches: int = 1
    batch_size: int = 2
    clip: float | None = None
    data_seed: int = 0
    loss_scale: float = 1.0
    norm_type: float = 2.0
    error_if_nonfinite: bool = True


@dataclass(frozen=True)
class FSDPConfig:
    """Options of the ``fsdp`` family, as data.

    Args:
        sharding_strategy: one of the five names.
        wrap: the auto-wrap policy.
        ac: the activation-checkpointing policy.
        precision: one of the five precision strings.
        device_mesh: ``(replicate, shard)`` for the hybrid strategies, else None.
        extra: other options, as ``(name, value)`` pairs (e.g. ``("use_orig_params", True)``).
    """

    sharding_strategy: str = "FULL_SHARD"
    wrap: WrapSpec = field(default_factory=WrapSpec)
    ac: ACSpec = field(default_factory=ACSpec)
    precision: str = "32-true"
    device_mesh: tuple[int, int] | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    family = "fsdp"

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``ctx.make_strategy("fsdp", **options)`` (on a rank)."""
        opts: dict[str, Any] = {
            "precision": self.precision,
            "sharding_strategy": self.sharding_strategy,
            "auto_wrap_policy": self.wrap.build(),
            "activation_checkpointing_policy": self.ac.build(),
        }
        if self.device_mesh is not None:
            opts["device_mesh"] = self.device_mesh
        if self.extra:
            opts["extra"] = dict(self.extra)
        return opts


@dataclass(frozen=True)
class MPConfig:
    """Options of the ``model_parallel`` family and its ``parallelize_fn``, as data.

    Args:
        data_parallel_size: size of the ``data_parallel`` mesh dim.
        tensor_parallel_size: size of the ``tensor_parallel`` mesh dim.
        tp_plan: ``none`` or ``mlp`` (every Block and AttentionBlock: fc1 column-wise, fc2
            row-wise; hand-written attention's wq/wk/wv column-wise, wo row-wise).
        fsdp_classes: zoo classes that get their own ``fully_shard`` before the root.
        reshard_after_forward: FSDP2's option.
        precision: ``32-true`` or ``bf16-mixed`` (the latter via FSDP2's policy).
    """

    data_parallel_size: int = 1
    tensor_parallel_size: int = 1
    tp_plan: str = "none"
    fsdp_classes: tuple[str, ...] = ("Block",)
    reshard_after_forward: bool = True
    precision: str = "32-true"

    family = "model_parallel"

    def parallelize_fn(self) -> Callable[[nn.Module, DeviceMesh], nn.Module]:
        """The ``parallelize_fn`` the strategy gets (built on the ranks):
        :func:`~suites.lib.shared.parallelize.parallelize_zoo` with this configuration's plan,
        units, resharding and precision."""
        return functools.partial(
            parallelize_zoo,
            tp_plan=self.tp_plan,
            fsdp_classes=self.fsdp_classes,
            reshard_after_forward=self.reshard_after_forward,
            precision=self.precision,
        )

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``ctx.make_strategy("model_parallel", **options)``."""
        return {
            "precision": self.precision,
            "parallelize_fn": self.parallelize_fn(),
            "data_parallel_size": self.data_parallel_size,
            "tensor_parallel_size": self.tensor_parallel_size,
        }


@dataclass(frozen=True)
class FSDP2Config:
    """Options of the ``fsdp2`` family (a strategy that applies ``fully_shard`` itself), as
    data.

    Args:
        wrap: the policy whose modules get their own ``fully_shard`` before the root.
        reshard_after_forward: ``True``, ``False``, or the int size to reshard to.
        ac: the activation-checkpointing policy.
        precision: one of the five precision strings.
        device_mesh: ``(replicate, shard)`` for HSDP; None: one shard dim over the world.
        extra: other options, as ``(name, value)`` pairs.
    """

    wrap: WrapSpec = field(default_factory=WrapSpec)
    reshard_after_forward: bool | int = True
    ac: ACSpec = field(default_factory=ACSpec)
    precision: str = "32-true"
    device_mesh: tuple[int, int] | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    family = "fsdp2"

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``ctx.make_strategy("fsdp2", **options)`` (on a rank)."""
        opts: dict[str, Any] = {
            "precision": self.precision,
            "auto_wrap_policy": self.wrap.build(),
            "reshard_after_forward": self.reshard_after_forward,
            "activation_checkpointing_policy": self.ac.build(),
        }
        if self.device_mesh is not None:
            opts["device_mesh"] = self.device_mesh
        if self.extra:
            opts["extra"] = dict(self.extra)
        return opts


#: a scenario's strategy options, of any family
StrategyConfig = FSDPConfig | MPConfig | FSDP2Config


@dataclass(frozen=True)
class Scenario:
    """One drawn configuration: world, model, strategy options, optimizer, training plan.

    Args:
        world_size: number of ranks.
        model: the model tree.
        strategy: the family's options.
        optim: the optimizer.
        plan: the training plan.
        empty_init: create the model in ``module_init_context(empty_init=True)``.
    """

    world_size: int
    model: ModelSpec
    strategy: StrategyConfig
    optim: OptimSpec = field(default_factory=OptimSpec)
    plan: TrainPlan = field(default_factory=TrainPlan)
    empty_init: bool = False

    @property
    def family(self) -> str:
        """``fsdp``, ``model_parallel`` or ``fsdp2``."""
        return self.strategy.family

    @property
    def precision(self) -> str:
        """The precision string."""
        return self.strategy.precision

    @property
    def dp_size(self) -> int:
        """Number of data-parallel ranks (distinct micro-batches per step)."""
        if isinstance(self.strategy, MPConfig):
            return self.strategy.data_parallel_size
        return self.world_size

    @property
    def shard_factor(self) -> int:
        """How many ranks split one parameter: FSDP1's shard group (1 under ``NO_SHARD``, the
        mesh's inner size under hybrid sharding), FSDP2's data-parallel size (the fsdp2
        family: the mesh's shard dim)."""
        config = self.strategy
        if isinstance(config, MPConfig):
            return config.data_parallel_size
        if isinstance(config, FSDP2Config):
            return config.device_mesh[1] if config.device_mesh else self.world_size
        if config.sharding_strategy == "NO_SHARD":
            return 1
        return config.device_mesh[1] if config.device_mesh else self.world_size

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``ctx.make_strategy(scenario.family, **options)``."""
        return self.strategy.options()
