"""Hypothesis strategies that draw valid :class:`~suites.lib.shared.specs.Scenario` s (and
their parts), and :func:`examples`, the number of examples a test draws.

Only valid combinations are drawn: meshes divide the world, tied weights never straddle two
wrap units, tensor-parallel widths divide by the tensor-parallel size, fp16 Adam gets
``eps >= 1e-4``. Everything is small (hidden <= 8, 1-3 steps) so a 4-rank example takes
well under a second on CPU. World sizes go up to ``harness.max_world_size()`` (``--nproc``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import pytest
from hypothesis import settings
from hypothesis import strategies as st

from suites.lib.shared.models import (
    BLOCK_KINDS,
    LOOKALIKE_KINDS,
    BlockSpec,
    ModelSpec,
    build_model,
)
from suites.lib.shared.specs import (
    ACSpec,
    FSDP2Config,
    FSDPConfig,
    MPConfig,
    OptimSpec,
    Scenario,
    TrainPlan,
    WrapSpec,
)

__all__ = [
    "ALL_PRECISIONS",
    "FSDP_PRECISIONS",
    "SHARDING_STRATEGIES",
    "ac_specs",
    "available_world_sizes",
    "examples",
    "fsdp2_configs",
    "fsdp_configs",
    "job_world",
    "max_world_size",
    "meshes",
    "model_specs",
    "mp_configs",
    "optim_specs",
    "scenarios",
    "splits_tied",
    "train_plans",
    "valid_wrap",
    "world_sizes",
    "wrap_specs",
]

SHARDING_STRATEGIES = (
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "_HYBRID_SHARD_ZERO2",
)
ALL_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")
FSDP_PRECISIONS = ALL_PRECISIONS
MP_PRECISIONS = ("32-true", "bf16-mixed")
WRAP_CLASSES = ("Block", "NestedBlock", "AttentionBlock", "Scale")
#: the wrap policy kinds the fsdp2 family is drawn with: a set of classes, a
#: ``fn(module) -> bool``, and an FSDP1-style size policy
FSDP2_WRAP_KINDS = ("none", "classes", "module_fn", "size")
#: zoo classes the model_parallel family may give their own ``fully_shard``
MP_UNIT_CLASSES = ("Block", "NestedBlock", "AttentionBlock")


def examples(n: int) -> settings:
    """``n`` tenths of the active profile's examples, at least one (``ci``'s 6: 1, 1 and 3
    for ``n`` = 1, 2 and 5; ``dev``'s 25: 2, 5 and 12; ``nightly``'s 250: 25, 50, 125)."""
    base = settings().max_examples
    return settings(max_examples=max(1, n * base // 10))


def max_world_size() -> int:
    """The largest world size the session may use (``--nproc``; 4 without the harness)."""
    try:
        from harness import max_world_size as harness_max
    except ImportError:
        return 4
    return int(harness_max())


def available_world_sizes() -> list[int]:
    """Every world size the session can run (``1..--nproc``; ``1..N`` in attach mode, for
    torchrun's ``N`` ranks)."""
    try:
        from harness import world_sizes as harness_sizes
    except ImportError:
        return list(range(1, max_world_size() + 1))
    return list(harness_sizes())


def smallest_world() -> int:
    """The smallest world size a check that holds at any size draws: 2 (a world of one
    rank shards nothing), or 1 when the session has one rank only (``--nproc 1``, the only
    NCCL world of a one-GPU machine), so such a session still runs every check that can run
    on one rank."""
    return 1 if max(available_world_sizes()) == 1 else 2


def job_world(preferred: int = 2, *, minimum: int = 1) -> int:
    """The world size of a check that holds at any world size from ``preferred`` up.

    ``preferred`` when the session can run it (always in local mode with ``--nproc`` at
    least ``preferred``, so local runs stay exactly as they were); else the smallest world
    size the session has above ``preferred`` (attach mode: torchrun's); in a one-rank
    session 1 (see :func:`smallest_world`: a check that needs two ranks asks
    ``run_on_ranks`` for 2 itself); else ``preferred``,
    which the harness then reports as ``environment`` with the reason.

    Args:
        preferred: the world size the check was written for (at least 1).
        minimum: the fewest ranks the check can run with (2 for a check of what only
            several ranks do, such as a sharding strategy FSDP drops at world size 1).

    Raises:
        ValueError: ``preferred`` is below 1.
    """
    if preferred < 1:
        raise ValueError(
            f"job_world(preferred={preferred}): a world size must be at least 1; pass the "
            "number of ranks the check was written for."
        )
    sizes = available_world_sizes()
    if preferred in sizes:
        return preferred
    larger = [s for s in sizes if s > preferred]
    if larger:
        return min(larger)
    return 1 if sizes == [1] and minimum <= 1 else preferred  # see smallest_world


@st.composite
def world_sizes(draw: st.DrawFn, min_size: int | None = None, max_size: int | None = None) -> int:
    """A world size in ``[min_size, min(max_size, --nproc)]`` the session can run.

    ``min_size`` left out is :func:`smallest_world` (2, or 1 in a one-rank session); a
    check that needs several ranks passes its need. A range with no size the session can
    run skips the check as ``environment``.
    """
    min_size = smallest_world() if min_size is None else min_size
    top = max_world_size() if max_size is None else min(max_size, max_world_size())
    if top < min_size:
        pytest.skip(
            f"environment: needs world size {min_size} or more but --nproc is "
            f"{max_world_size()}; run with --nproc {min_size} or more"
        )
    sizes = [s for s in available_world_sizes() if min_size <= s <= top]
    if sizes == list(range(min_size, top + 1)):
        return draw(st.integers(min_size, top))
    if not sizes:
        pytest.skip(f"environment: needs a world size in [{min_size}, {top}]; this run has none")
    return draw(st.sampled_from(sizes))


def meshes(world_size: int) -> st.SearchStrategy[tuple[int, int]]:
    """2-D meshes ``(a, b)`` with ``a * b == world_size`` (hybrid ``(replicate, shard)`` or
    ``(data_parallel, tensor_parallel)``)."""
    shapes = [(a, world_size // a) for a in range(1, world_size + 1) if world_size % a == 0]
    return st.sampled_from(shapes)


def _token_counts(hidden: int) -> tuple[int, ...]:
    """Token counts for an AttentionBlock on ``hidden``: divisors leaving tokens at least 3
    wide, several tokens first (Hypothesis' simplest draw), then a single token.

    Narrower tokens are not drawn. A one-wide token's LayerNorm outputs its bias whatever
    the input, so its weight's gradient is pure rounding noise, which Adam's first step
    blows up to ``lr`` (measured: ``dev`` seed 1 failed TRAIN-2 parity on
    ``norm_attn.weight``). A two-wide token's LayerNorm outputs ``(+1, -1)`` or
    ``(-1, +1)`` times its weight whatever the scale of the input, so the gradient it passes
    back is rounding noise too, divided by the two values' small difference: under
    ``bf16-mixed`` the clip norm of a data-parallel run came out 20% above the fp32 model's
    (measured: the configuration cover's model_parallel (2, 2)-mesh row, hidden 6 in 3
    tokens), which no tolerance of a correct strategy should absorb.
    """
    return (*(t for t in range(2, hidden) if hidden % t == 0 and hidden // t >= 3), 1)


@st.composite
def _block_specs(
    draw: st.DrawFn, kind: str, hidden: int, ffn_multiple: int, heads_multiple: int
) -> BlockSpec:
    attention = kind == "AttentionBlock"
    return BlockSpec(
        kind=kind,
        ffn=ffn_multiple * draw(st.integers(1, max(1, 8 // ffn_multiple))),
        norm=draw(st.booleans()),
        inner=draw(st.integers(1, 2)) if kind == "NestedBlock" else 0,
        attention=draw(st.sampled_from(("hand", "mha"))) if attention else "hand",
        heads=heads_multiple * draw(st.integers(1, 2)) if attention else 1,
        tokens=draw(st.sampled_from(_token_counts(hidden))) if attention else 1,
    )


def _kinds(
    draw: st.DrawFn, n_blocks: int, nested: bool | None, attention: bool | None
) -> list[str]:
    kinds = [draw(st.sampled_from(BLOCK_KINDS)) for _ in range(n_blocks)]
    if nested is False:
        kinds = ["Block" if k == "NestedBlock" else k for k in kinds]
    if attention is False:
        kinds = ["Block" if k == "AttentionBlock" else k for k in kinds]
    if nested is True and "NestedBlock" not in kinds:
        kinds[-1] = "NestedBlock"
    if attention is True and "AttentionBlock" not in kinds:
        kinds[0] = "AttentionBlock"
    return kinds


@st.composite
def model_specs(
    draw: st.DrawFn,
    *,
    max_blocks: int = 2,
    nested: bool | None = None,
    tied: bool | None = None,
    frozen: bool | None = None,
    ffn_multiple: int = 1,
    heads_multiple: int = 1,
    scale: bool | None = None,
    attention: bool | None = None,
    root_param: bool | None = None,
    shared: bool | None = None,
    running_stats: bool | None = False,
    lookalikes: bool | None = False,
) -> ModelSpec:
    """A small model tree.

    Args:
        max_blocks: most blocks in the trunk.
        nested: force (True) or forbid (False) a NestedBlock; None: either.
        tied: force or forbid tied embedding/head weights; None: either.
        frozen: force or forbid frozen parameters; None: either.
        ffn_multiple: every MLP width is a multiple of this (the tensor-parallel size).
        heads_multiple: every attention head count is a multiple of this (the
            tensor-parallel size: the plan gives each rank whole heads).
        scale: force or forbid the ``Scale`` module (buffers, a one-element parameter).
        attention: force or forbid an AttentionBlock; None: either.
        root_param: force or forbid a parameter on the root module; None: either.
        shared: force or forbid a Block called twice in forward; None: either.
        running_stats: force or forbid a BatchNorm with running statistics; None: either.
            Forbidden unless asked: the configuration cover gives it to every clause's checks
            (``COVER_MODELS``), and leaving it out of the random draws keeps every check's
            derandomized ``ci`` examples, and the single-process emulations of
            ``tests/suites_lib/test_tolerance_fit.py`` (which update the statistics once per
            rank), as they were.
        lookalikes: force or forbid, after the drawn blocks, a ``ScaledBlock`` (a subclass
            of ``Block``) and a ``ForeignBlock`` (another module's class named ``Block``):
            :data:`~suites.lib.shared.models.LOOKALIKE_KINDS`; None: either. Forbidden unless
            asked, for the same reason: only the checks of WRAP-1, FSDP2-1 and AC-1, whose
            "each instance of those classes" they test, draw them.
    """
    n_blocks = draw(st.integers(1, max_blocks))
    hidden = draw(st.integers(3, 8))
    kinds = _kinds(draw, n_blocks, nested, attention)
    if draw(st.booleans()) if lookalikes is None else lookalikes:
        kinds += LOOKALIKE_KINDS
    blocks = tuple(draw(_block_specs(k, hidden, ffn_multiple, heads_multiple)) for k in kinds)
    is_tied = draw(st.booleans()) if tied is None else tied
    vocab = draw(st.integers(3, 9)) if is_tied or draw(st.booleans()) else 0
    spec = ModelSpec(
        hidden=hidden,
        blocks=blocks,
        vocab=vocab,
        in_features=draw(st.integers(2, 6)),
        out=vocab if is_tied else draw(st.integers(1, 5)),
        tied=is_tied,
        scale=draw(st.booleans()) if scale is None else scale,
        root_param=draw(st.booleans()) if root_param is None else root_param,
        shared=draw(st.booleans()) if shared is None else shared,
        shared_ffn=ffn_multiple * draw(st.integers(1, max(1, 8 // ffn_multiple))),
        seed=draw(st.integers(0, 2**16)),
        running_stats=draw(st.booleans()) if running_stats is None else running_stats,
    )
    if frozen is False or (frozen is None and not draw(st.booleans())):
        return spec
    names = [n for n, _ in build_model(spec, "meta").named_parameters()]
    chosen = draw(
        st.lists(st.sampled_from(names), min_size=1, max_size=len(names) - 1, unique=True)
    )
    return dataclasses.replace(spec, frozen=tuple(sorted(chosen)))


def _trainable(spec: ModelSpec) -> ModelSpec:
    """``spec`` with the frozen names its model no longer has dropped, and nothing frozen
    where nothing would be left to train (then even the plain model's backward raises): for
    specs changed after they were drawn."""
    names = {n for n, _ in build_model(spec, "meta").named_parameters()}
    frozen = tuple(n for n in spec.frozen if n in names)
    return dataclasses.replace(spec, frozen=() if names <= set(frozen) else frozen)


def with_scale(spec: ModelSpec, scale: bool) -> ModelSpec:
    """``spec`` with its ``Scale`` module added or removed, still with a parameter to train
    (removing it can remove the only one: ``scale.gate``)."""
    return _trainable(dataclasses.replace(spec, scale=scale))


def plain_blocks(spec: ModelSpec) -> ModelSpec:
    """``spec`` with every block a plain ``Block`` (the same widths, no attention or inner
    block), still with a parameter to train."""
    blocks = tuple(dataclasses.replace(b, kind="Block") for b in spec.blocks)
    return _trainable(dataclasses.replace(spec, blocks=blocks))


def _present_classes(spec: ModelSpec) -> list[str]:
    """The classes of :data:`WRAP_CLASSES` a policy for ``spec`` may list: those the model
    holds instances of, and ``Block`` beside a block of :data:`LOOKALIKE_KINDS` (its
    subclass, or another class of its name that the policy must leave alone)."""
    kinds = {b.kind for b in spec.blocks}
    if kinds & {"NestedBlock", *LOOKALIKE_KINDS} or spec.shared:
        kinds.add("Block")
    if spec.scale:
        kinds.add("Scale")
    return [c for c in WRAP_CLASSES if c in kinds]


def splits_tied(spec: ModelSpec, wrap: WrapSpec) -> bool:
    """Whether ``wrap`` puts the two names of tied weights in different FSDP units (the
    suites never draw such a policy: tied weights stay in one unit)."""
    units = wrap.expected_units(build_model(spec, "meta"))
    return spec.tied and bool(units & {"embed", "head"})


def _splits_mha(spec: ModelSpec, wrap: WrapSpec) -> bool:
    """Whether ``wrap`` makes a unit of a module inside an ``nn.MultiheadAttention``.

    [Note: MultiheadAttention's out_proj is never called] ``nn.MultiheadAttention.forward``
    passes ``out_proj.weight`` to ``F.multi_head_attention_forward`` and never calls
    ``out_proj`` (pytorch/pytorch#78109: hooks on ``out_proj`` never run), so an FSDP1
    unit of ``out_proj`` alone is never unsharded before use. No strategy can shard that
    layout; a size-based policy would pick it, so those thresholds are not drawn.
    """
    units = wrap.expected_units(build_model(spec, "meta"))
    return any(".mha." in f"{unit}." and not unit.endswith(".mha") for unit in units)


def valid_wrap(spec: ModelSpec, wrap: WrapSpec) -> bool:
    """Whether the suites draw ``wrap`` for ``spec``: it keeps tied weights in one unit and
    makes no unit inside an ``nn.MultiheadAttention``."""
    return not splits_tied(spec, wrap) and not _splits_mha(spec, wrap)


@st.composite
def wrap_specs(draw: st.DrawFn, spec: ModelSpec, kinds: Sequence[str] | None = None) -> WrapSpec:
    """An auto-wrap policy valid for ``spec`` (tied weights stay in one unit).

    Args:
        spec: the model the policy will wrap.
        kinds: restrict the policy kinds (default: all of ``WrapSpec``'s kinds).
    """
    kind = draw(
        st.sampled_from(
            tuple(
                kinds
                or ("none", "classes", "module_wrap_policy", "custom_policy", "size", "callable")
            )
        )
    )
    if kind == "none":
        return WrapSpec()
    if kind == "size":
        model = build_model(spec, "meta")
        numels = sorted({sum(p.numel() for p in m.parameters()) for m in model.modules()})
        valid = [n for n in numels if n > 0 and valid_wrap(spec, WrapSpec("size", (), n))]
        return WrapSpec("size", min_num_params=draw(st.sampled_from(valid)))
    present = _present_classes(spec)
    classes = draw(st.lists(st.sampled_from(present), min_size=1, unique=True))
    return WrapSpec(kind, classes=tuple(sorted(classes)))


@st.composite
def ac_specs(draw: st.DrawFn, spec: ModelSpec, allow_none: bool = True) -> ACSpec:
    """An activation-checkpointing policy whose selected modules never nest."""
    kinds = ("classes", "module_wrap_policy", "callable")
    kind = draw(st.sampled_from(("none", *kinds) if allow_none else kinds))
    if kind == "none":
        return ACSpec()
    present = _present_classes(spec)
    first = draw(st.sampled_from(present))  # never Block with NestedBlock: they would nest
    classes = {first}
    if first != "Scale" and "Scale" in present and draw(st.booleans()):
        classes.add("Scale")
    return ACSpec(kind, classes=tuple(sorted(classes)))


@st.composite
def optim_specs(draw: st.DrawFn, kinds: Sequence[str] = ("sgd", "adam", "adamw")) -> OptimSpec:
    """An optimizer with one or several groups (Adam's eps 1e-4: ``tolerances._FP32_ADAM``)."""
    kind = draw(st.sampled_from(tuple(kinds)))
    lr = draw(st.sampled_from((0.05, 0.1) if kind == "sgd" else (0.003, 0.01)))
    return OptimSpec(
        kind=kind,
        lr=lr,
        groups=draw(st.sampled_from(("one", "by_kind", "by_depth"))),
        momentum=draw(st.sampled_from((0.0, 0.9))),
        eps=1e-4,  # see tolerances._FP32_ADAM
        weight_decay=0.1 if kind == "adamw" else 0.0,
    )


@st.composite
def train_plans(
    draw: st.DrawFn,
    *,
    max_steps: int = 2,
    max_micro: int = 1,
    clip: bool | None = False,
    min_micro: int = 1,
) -> TrainPlan:
    """A short training plan.

    Args:
        max_steps: most optimizer steps (at least 1).
        max_micro: most micro-batches per step.
        min_micro: fewest micro-batches per step.
        clip: force (True) or forbid (False) gradient clipping; None: either.
    """
    do_clip = draw(st.booleans()) if clip is None else clip
    return TrainPlan(
        steps=draw(st.integers(1, max_steps)),
        micro_batches=draw(st.integers(min_micro, max(min_micro, max_micro))),
        batch_size=draw(st.integers(1, 3)),
        clip=draw(st.sampled_from((0.05, 0.5, 100.0))) if do_clip else None,
        data_seed=draw(st.integers(0, 2**16)),
    )


@st.composite
def fsdp_configs(
    draw: st.DrawFn,
    world_size: int,
    spec: ModelSpec,
    *,
    sharding: Sequence[str] = SHARDING_STRATEGIES,
    precisions: Sequence[str] = ("32-true",),
    wrap_kinds: Sequence[str] | None = None,
    ac: bool = False,
) -> FSDPConfig:
    """Options of the fsdp family; hybrid strategies get a mesh that divides the world."""
    strategy = draw(st.sampled_from(tuple(sharding)))
    mesh = draw(meshes(world_size)) if "HYBRID" in strategy else None
    return FSDPConfig(
        sharding_strategy=strategy,
        wrap=draw(wrap_specs(spec, wrap_kinds)),
        ac=draw(ac_specs(spec, allow_none=False)) if ac else ACSpec(),
        precision=draw(st.sampled_from(tuple(precisions))),
        device_mesh=mesh,
    )


def fsdp2_reshards(world_size: int, mesh: tuple[int, int] | None) -> tuple[bool | int, ...]:
    """The ``reshard_after_forward`` values valid on ``world_size`` ranks (and ``mesh``):
    True, False, and every int that divides the shard dim strictly between 1 and it."""
    shard = mesh[1] if mesh is not None else world_size
    return (True, False, *(n for n in range(2, shard) if shard % n == 0))


@st.composite
def fsdp2_configs(
    draw: st.DrawFn,
    world_size: int,
    spec: ModelSpec,
    *,
    precisions: Sequence[str] = ("32-true",),
    wrap_kinds: Sequence[str] = FSDP2_WRAP_KINDS,
    hsdp: bool | None = None,
    ac: bool = False,
) -> FSDP2Config:
    """Options of the fsdp2 family: a wrap policy, ``reshard_after_forward``, and HSDP on a
    ``(replicate, shard)`` mesh of the world (``hsdp``: force, forbid, or either)."""
    use_mesh = (draw(st.booleans()) if hsdp is None else hsdp) and world_size > 1
    mesh = draw(meshes(world_size).filter(lambda m: m[0] > 1)) if use_mesh else None
    return FSDP2Config(
        wrap=draw(wrap_specs(spec, [k for k in wrap_kinds if k in FSDP2_WRAP_KINDS])),
        reshard_after_forward=draw(st.sampled_from(fsdp2_reshards(world_size, mesh))),
        ac=draw(ac_specs(spec, allow_none=False)) if ac else ACSpec(),
        precision=draw(st.sampled_from(tuple(precisions))),
        device_mesh=mesh,
    )


@st.composite
def mp_configs(
    draw: st.DrawFn, world_size: int, *, precisions: Sequence[str] = ("32-true",)
) -> MPConfig:
    """Options of the model_parallel family: a 2-D ``(dp, tp)`` mesh of the world."""
    dp, tp = draw(meshes(world_size))
    return MPConfig(
        data_parallel_size=dp,
        tensor_parallel_size=tp,
        # no plan on a 1-wide tensor-parallel dim: torch's DTensor cannot propagate a view
        # of a [1, k] Shard(1) tensor there (a batch of one row fails in backward)
        tp_plan="mlp" if tp > 1 else "none",
        fsdp_classes=tuple(draw(st.lists(st.sampled_from(MP_UNIT_CLASSES), unique=True))),
        reshard_after_forward=draw(st.booleans()),
        precision=draw(st.sampled_from(tuple(precisions))),
    )


@st.composite
def scenarios(
    draw: st.DrawFn,
    family: str = "fsdp",
    *,
    world_size: int | None = None,
    min_world: int | None = None,
    precisions: Sequence[str] = ("32-true",),
    sharding: Sequence[str] = SHARDING_STRATEGIES,
    wrap_kinds: Sequence[str] | None = None,
    ac: bool = False,
    optimizers: Sequence[str] = ("sgd", "adam", "adamw"),
    plan: st.SearchStrategy[TrainPlan] | None = None,
    empty_init: bool | None = False,
    tied: bool | None = None,
    frozen: bool | None = None,
    nested: bool | None = None,
    scale: bool | None = None,
    attention: bool | None = None,
    root_param: bool | None = None,
    shared: bool | None = None,
    running_stats: bool | None = False,
    lookalikes: bool | None = False,
) -> Scenario:
    """A whole scenario of ``family`` (``fsdp``, ``model_parallel`` or ``fsdp2``); keyword arguments
    restrict what is drawn (see the part strategies; ``attention=False`` keeps a long check
    on the smaller MLP-only models)."""
    world = world_size if world_size is not None else draw(world_sizes(min_world))
    shaped_models = functools.partial(
        model_specs,
        tied=tied,
        frozen=frozen,
        nested=nested,
        scale=scale,
        attention=attention,
        root_param=root_param,
        shared=shared,
        running_stats=running_stats,
        lookalikes=lookalikes,
    )
    config: FSDPConfig | MPConfig | FSDP2Config
    if family == "model_parallel":
        mp = draw(
            mp_configs(
                world, precisions=[p for p in precisions if p in MP_PRECISIONS] or MP_PRECISIONS
            )
        )
        tp = mp.tensor_parallel_size
        spec = draw(shaped_models(ffn_multiple=tp, heads_multiple=tp))
        config = mp
    elif family == "fsdp":
        spec = draw(shaped_models())
        config = draw(
            fsdp_configs(
                world, spec, sharding=sharding, precisions=precisions, wrap_kinds=wrap_kinds, ac=ac
            )
        )
    elif family == "fsdp2":
        spec = draw(shaped_models())
        kinds = [k for k in (wrap_kinds or FSDP2_WRAP_KINDS) if k in FSDP2_WRAP_KINDS]
        config = draw(
            fsdp2_configs(world, spec, precisions=precisions, wrap_kinds=kinds or ("none",), ac=ac)
        )
    else:
        raise ValueError(f"scenarios(family={family!r}): use 'fsdp', 'model_parallel' or 'fsdp2'.")
    drawn_plan = draw(plan if plan is not None else train_plans())
    if config.precision == "16-mixed":  # see TrainPlan.loss_scale
        drawn_plan = dataclasses.replace(drawn_plan, loss_scale=1 / 256)
    return Scenario(
        world_size=world,
        model=spec,
        strategy=config,
        optim=draw(optim_specs(optimizers)),
        plan=drawn_plan,
        empty_init=draw(st.booleans()) if empty_init is None else empty_init,
    )
