"""Rank-side jobs and helpers of the checkpoint suites (run inside ``run_on_ranks``).

Everything goes through the plug-in contract: :func:`build` sets up with
``ctx.make_strategy`` (the format is the strategy option :func:`format_options` gives:
``state_dict_type`` / ``save_distributed_checkpoint``), and :func:`read_state` reads the
gathered model and optimizer state with torch's own APIs (:mod:`suites.lib.ranks.readers`),
never with the strategy's save/load. :func:`save_rank`/:func:`load_rank` are the two halves
of a round trip that may run at two world sizes; :func:`attempt` records what an error case
raised and whether the files on disk changed.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from torch import Tensor

from harness import RankContext, Strategy, Unsupported
from harness.verdicts.attribution import clause
from suites.lib.ranks.readers import gathered_optim_state, gathered_state
from suites.lib.ranks.training import (
    RankResult,
    Trained,
    end,
    optimizer_state_dtypes,
    setup,
    train,
)
from suites.lib.shared.checkpoint_specs import (
    FORMATS,
    CkptPlan,
    fresh_metadata,
    make_metadata,
    plain_metadata,
)
from suites.lib.shared.files import files_digest
from suites.lib.shared.lr_schedules import (
    SCHEDULER_KEY,
    make_scheduler,
    read_scheduler,
    step_scheduler,
)
from suites.lib.shared.models import BlockSpec, ModelSpec, build_model, clean_name
from suites.lib.shared.specs import (
    FSDP2Config,
    FSDPConfig,
    MPConfig,
    OptimSpec,
    Scenario,
    TrainPlan,
)

__all__ = [
    "ERROR_SPEC",
    "REFERENCE_FACTORY",
    "attempt",
    "build",
    "build_with_two_optimizers",
    "check_no_saved_nonpersistent",
    "copy_buffers",
    "error_scenario",
    "format_options",
    "join_round_trip",
    "load_rank",
    "never_stepped",
    "nonpersistent_buffers",
    "path_for",
    "read_state",
    "read_unstepped",
    "reference_context",
    "round_trip_load_rank",
    "round_trip_rank",
    "round_trip_save_rank",
    "save_rank",
    "save_rank_or_reference",
    "saved_nonpersistent",
    "train_plan",
]


def format_options(family: str, fmt: str) -> dict[str, Any]:
    """The strategy option that selects checkpoint format ``fmt`` for ``family``."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not a checkpoint format; use one of {FORMATS}.")
    if family in ("fsdp", "fsdp2"):
        return {"state_dict_type": fmt}
    return {"save_distributed_checkpoint": fmt == "sharded"}


def build(ctx: RankContext, scenario: Scenario, fmt: str) -> Trained:
    """Strategy (with the format option), model and optimizer of ``scenario`` on this rank."""
    return setup(ctx, scenario, **format_options(scenario.family, fmt))


def train_plan(t: Trained, scenario: Scenario, *, steps: int | None = None) -> RankResult:
    """Train ``scenario``'s plan (or ``steps`` steps) on the set-up objects."""
    result = RankResult(0, t.strategy.distributed_sampler_kwargs["rank"])
    train(t, scenario, result, steps=steps)
    return result


def read_state(t: Trained) -> dict[str, Any]:
    """The gathered model and optimizer state, read with torch's own APIs (a collective)."""
    return {"model": gathered_state(t.model), "optim": gathered_optim_state(t.model, t.optimizer)}


def never_stepped(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` holds no state on any rank, as a plain optimizer before its first
    step (a collective: an FSDP1 rank holding no part of a parameter has none of its state)."""
    import torch.distributed as dist

    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, not optimizer.state)
    return all(everyone)


def read_unstepped(t: Trained) -> dict[str, Any]:
    """:func:`read_state` of objects whose optimizer may never have stepped (a collective).

    torch's reader initializes the state of an optimizer that has none (a step at learning
    rate 0, which counts as a step for Adam): when the optimizer had no state on any rank,
    that state is the read's, and is dropped from the read and from the optimizer, whose
    next step must then be a first step. An optimizer that has state (one a save stepped,
    say) reads as it is.
    """
    fresh = never_stepped(t.optimizer)
    out = read_state(t)
    if fresh:
        out["optim"]["state"] = {}
        t.optimizer.state.clear()
    return out


def nonpersistent_buffers(model: torch.nn.Module, names: set[str]) -> dict[str, Tensor]:
    """The values of the named non-persistent buffers (clean names), cloned to CPU."""
    return {
        clean_name(n): b.detach().to("cpu", copy=True)
        for n, b in model.named_buffers()
        if clean_name(n) in names
    }


def saved_nonpersistent(path: str, fmt: str, names: set[str]) -> list[str]:
    """Which of the non-persistent buffers ``names`` the checkpoint at ``path`` holds under
    its ``"model"`` entry: the full file's model state dict (read with ``weights_only``), or
    the ``model.<name>`` keys of a sharded directory's DCP metadata. A checkpoint that cannot
    be read so is left to the load (and its own clause): ``[]``."""
    try:
        if fmt == "full":
            content = torch.load(path, map_location="cpu", weights_only=True)
            model = content.get("model") if isinstance(content, dict) else None
            keys = set(model) if isinstance(model, dict) else set()
        else:
            from torch.distributed.checkpoint import FileSystemReader

            metadata = FileSystemReader(path).read_metadata().state_dict_metadata
            keys = {k.removeprefix("model.") for k in metadata if k.startswith("model.")}
    except Exception:  # unreadable here: the load reports what is wrong with it
        return []
    return sorted(keys & names)


def check_no_saved_nonpersistent(ctx: RankContext, plan: CkptPlan, path: str) -> None:
    """CKPT-BUF-1 on the checkpoint just saved: rank 0 reads which non-persistent buffers of
    the plain model it holds (:func:`saved_nonpersistent`) and tells every rank, so that all
    raise together, before any of them starts a load.

    Raises:
        AssertionError: the checkpoint holds a non-persistent buffer.
    """
    import torch.distributed as dist

    plain = build_model(plan.save.model, "meta")
    volatile = set(dict(plain.named_buffers())) - set(plain.state_dict())
    if not volatile:
        return
    found = [saved_nonpersistent(path, plan.fmt, volatile) if ctx.rank == 0 else []]
    if ctx.world_size > 1:
        dist.broadcast_object_list(found, src=0, device=ctx.device)
    if found[0]:
        where = "model state dict" if plan.fmt == "full" else "DCP metadata, under 'model.'"
        raise AssertionError(
            f"CKPT-BUF-1: the {plan.fmt} checkpoint saved at {path} holds the non-persistent "
            f"buffers {found[0]} (its {where}); a checkpoint holds the model's state_dict(), "
            "persistent buffers only, so a strict load into a fresh model meets these as "
            "unexpected keys. Leave buffers registered with persistent=False out of the save."
        )


def copy_buffers(
    target: torch.nn.Module, source: torch.nn.Module | dict[str, Tensor], names: set[str]
) -> None:
    """Copy the named (non-persistent) buffers of ``source`` (a model, or their values by
    clean name, as :func:`nonpersistent_buffers` gives them) into ``target``."""
    named = source.items() if isinstance(source, dict) else source.named_buffers()
    values = {clean_name(n): b for n, b in named if clean_name(n) in names}
    with torch.no_grad():
        for n, b in target.named_buffers():
            if clean_name(n) in values:
                b.copy_(values[clean_name(n)])


def path_for(directory: str, fmt: str) -> str:
    """The checkpoint path of a format inside ``directory`` (created if missing: the contract
    does not ask a save to create the parent of its path): a file or a directory."""
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, "ckpt.pt" if fmt == "full" else "ckpt")


def save_rank(ctx: Any, plan: CkptPlan, path: str) -> dict[str, Any]:
    """Rank job: train and save ``plan.save``; return what was saved, read with torch's APIs."""
    t = build(ctx, plan.save, plan.fmt)
    train_plan(t, plan.save)
    state = {"model": t.model, "optimizer": t.optimizer, **make_metadata(plan.meta)}
    t.strategy.save_checkpoint(path, state)
    out = read_state(t)  # after the save: reading may initialize a never-stepped optimizer
    out["world_size"] = ctx.world_size
    end(t.strategy)
    return out


#: the factory of the reference strategies (``reference_impl``), whatever ``--strategy`` says
REFERENCE_FACTORY = "reference_impl:make_strategy"


def reference_context(ctx: RankContext) -> RankContext:
    """``ctx`` whose ``make_strategy`` builds the reference strategy of a family
    (:data:`REFERENCE_FACTORY`), without the strategy under test's ``--strategy-option``
    values."""
    return dataclasses.replace(ctx, factory=REFERENCE_FACTORY, strategy_options={})


def save_rank_or_reference(ctx: Any, plan: CkptPlan, path: str) -> dict[str, Any]:
    """:func:`save_rank` by the strategy under test, or, where it refuses ``plan.save``'s
    family as a whole (``Unsupported`` naming the option ``family``), by the reference
    strategy of that family (:func:`reference_context`): CKPT-RT-6 asks a strategy to load the
    full checkpoints of the other families, which a strategy of one family cannot write.
    ``"writer"`` says which wrote it (``strategy`` or ``reference``). Any other refusal stands.
    """
    try:
        out = save_rank(ctx, plan, path)
        out["writer"] = "strategy"
    except Unsupported as exc:
        if exc.option != "family" or exc.value != plan.save.family:
            raise
        out = save_rank(reference_context(ctx), plan, path)
        out["writer"] = "reference"
    return out


def load_rank(ctx: Any, plan: CkptPlan, path: str, resave: str | None = None) -> dict[str, Any]:
    """Rank job: load ``path`` into fresh objects of ``plan.load``; read them with torch's APIs.

    With ``resave``, also save them again (in the sharded format) to ``resave``, load that
    into other fresh objects and read those too (``"again"``).
    """
    fmt = "sharded" if resave else plan.fmt
    f = build(ctx, plan.load, fmt)
    returned = f.strategy.load_checkpoint(path, {"model": f.model, "optimizer": f.optimizer})
    out = read_state(f)
    out["world_size"] = ctx.world_size
    out["returned"] = plain_metadata(dict(returned or {}))
    if resave:
        f.strategy.save_checkpoint(resave, {"model": f.model, "optimizer": f.optimizer})
        g = build(ctx, plan.load, fmt)
        g.strategy.load_checkpoint(resave, {"model": g.model, "optimizer": g.optimizer})
        out["again"] = read_state(g)
        end(g.strategy)
    end(f.strategy)
    return out


#: the model of the error-contract tests: small, with a Scale module (buffers)
ERROR_SPEC = ModelSpec(hidden=4, blocks=(BlockSpec(ffn=4),), scale=True, seed=3)


def error_scenario(family: str, world: int = 2) -> Scenario:
    """A small scenario: FULL_SHARD, fully_shard over the world (fsdp2), or tensor parallel
    over the world (DTensor parameters)."""
    config: Any = (
        FSDPConfig("FULL_SHARD")
        if family == "fsdp"
        else FSDP2Config()
        if family == "fsdp2"
        else MPConfig(data_parallel_size=1, tensor_parallel_size=world, tp_plan="mlp")
    )
    return Scenario(world, ERROR_SPEC, config, OptimSpec("adam", lr=0.01), TrainPlan(steps=1))


def attempt(fn: Any, watch: str) -> dict[str, Any]:
    """Run ``fn``; record what it raised and whether the files under ``watch`` changed.
    An ``Unsupported`` is not recorded: it is the strategy's refusal, raised on."""
    before = files_digest(watch) if os.path.exists(watch) else {}
    record: dict[str, Any] = {"type": None, "message": "", "is_exception": True}
    try:
        fn()
    except Unsupported:
        raise  # a refusal, not an answer to record: the check is unsupported, as from a factory
    except BaseException as exc:  # CheckpointException is a BaseException
        record.update(
            type=type(exc).__name__,
            message=str(exc),
            is_exception=isinstance(exc, Exception),
            mro=[c.__name__ for c in type(exc).__mro__],
        )
    after = files_digest(watch) if os.path.exists(watch) else {}
    record["unchanged"] = before == after
    return record


def build_with_two_optimizers(
    ctx: RankContext, scenario: Scenario, fmt: str = "full", empty_init: bool = False
) -> tuple[Strategy, Any, list[Any]]:
    """Strategy (checkpoint format ``fmt``), set-up model and two optimizers: the blocks with
    the scenario's optimizer, the rest at half its learning rate (a trainer's layout).

    Args:
        ctx: the rank's context.
        scenario: model, strategy configuration and optimizer.
        fmt: ``full`` or ``sharded`` checkpoints.
        empty_init: build the model under ``module_init_context(empty_init=True)``.
    """
    options = {**scenario.options(), **format_options(scenario.family, fmt)}
    strategy = ctx.make_strategy(scenario.family, **options)
    strategy.setup_environment()
    with strategy.module_init_context(empty_init=empty_init):
        model: torch.nn.Module = build_model(scenario.model)
    model = strategy.setup_module(model)
    named = list(model.named_parameters())
    trunk = [(n, p) for n, p in named if clean_name(n).startswith("blocks.")]
    rest = [(n, p) for n, p in named if not clean_name(n).startswith("blocks.")]
    half = dataclasses.replace(scenario.optim, lr=scenario.optim.lr / 2)
    optimizers = [scenario.optim.build(trunk), half.build(rest)]
    return strategy, model, [strategy.setup_optimizer(o) for o in optimizers]


def round_trip_rank(
    ctx: RankContext, plan: CkptPlan, directory: str, effects: bool = False
) -> dict[str, Any]:
    """Rank job: train ``plan.save`` and save it with metadata; load into fresh objects of
    ``plan.load``; read both with torch's gathered-state APIs; then one more step with each.

    The metadata always holds a learning-rate scheduler
    (:func:`~suites.lib.shared.lr_schedules.make_scheduler`, under ``SCHEDULER_KEY``) over
    the optimizer, stepped as often as it; the load asks for it back into a fresh scheduler
    over the fresh optimizer (CKPT-SAVE-4, CKPT-LOAD-2).

    The same round trip in two jobs, with the checkpoint judged as written in between, is
    :func:`round_trip_save_rank` then :func:`round_trip_load_rank`; this one job keeps both
    sets of objects alive together (the configuration cover runs it).

    Args:
        ctx: the harness ``RankContext``.
        plan: the round trip (``plan.load`` at the same world size).
        directory: where the checkpoint goes (:func:`path_for`).
        effects: also return the training (``trained``: losses, clip norms, the state
            before the save), the state read just before the save (``before``) and the
            dtypes of the trained parameters and optimizer state (``dtypes``), for TRAIN-1,
            SHARD-2, CKPT-SAVE-7 and PREC-1/2/3. Off for plans that never step: reading an
            optimizer that never stepped initializes its state, which the save would then
            hold. A plan that never steps reads with :func:`read_unstepped`, so an optimizer
            without state reads as empty and stays so (the check asks exactly that of the
            saved and the loaded optimizer: the save before the first step).

    Returns:
        ``saved``, ``loaded``, ``restored``, ``same_counter``, ``returned``, ``volatile``,
        ``scheduler``, ``after_step`` (see
        :func:`suites.lib.controller.checkpoint_checks.check_round_trip`), plus ``trained``,
        ``before`` and ``dtypes`` with ``effects``.
    """
    t, scheduler, saving = _round_trip_save(ctx, plan, directory, effects)
    saving["scheduler"] = read_scheduler(scheduler)
    f, loading = _round_trip_load(ctx, plan, directory)
    copy_buffers(f.model, t.model, _volatile(plan))  # not saved by design: align them to step on
    train_plan(t, plan.save, steps=1)
    train_plan(f, plan.load, steps=1)
    # the models only: gathering the optimizers too (two collectives per state tensor) cost
    # a fifth of the round trip's rank time, for state nobody compares
    saving["stepped"], loading["stepped"] = gathered_state(t.model), gathered_state(f.model)
    out = join_round_trip(saving, loading)
    end(t.strategy)
    end(f.strategy)
    return out


def round_trip_save_rank(
    ctx: RankContext, plan: CkptPlan, directory: str, effects: bool = False
) -> dict[str, Any]:
    """Rank job, the first half of :func:`round_trip_rank`: train ``plan.save``, save it
    with metadata and a scheduler, read it, then take one more step with the saved objects.

    Returns:
        ``saved`` (read after the save), ``scheduler`` (its state at the save), ``volatile``
        (the non-persistent buffers at the save, which :func:`round_trip_load_rank` copies
        into the fresh objects), ``stepped`` (the model after one more step), plus
        ``trained``, ``before`` and ``dtypes`` with ``effects``.
    """
    t, scheduler, out = _round_trip_save(ctx, plan, directory, effects)
    out["scheduler"] = read_scheduler(scheduler)
    out["volatile"] = nonpersistent_buffers(t.model, _volatile(plan))
    train_plan(t, plan.save, steps=1)
    out["stepped"] = gathered_state(t.model)
    end(t.strategy)
    return out


def round_trip_load_rank(
    ctx: RankContext, plan: CkptPlan, directory: str, volatile: list[dict[str, Tensor]]
) -> dict[str, Any]:
    """Rank job, the second half of :func:`round_trip_rank`: load the checkpoint
    :func:`round_trip_save_rank` wrote into fresh objects of ``plan.load``, read them, then
    take one step with them.

    Args:
        ctx: the harness ``RankContext``.
        plan: the round trip.
        directory: where the checkpoint is.
        volatile: each saving rank's non-persistent buffers (``volatile`` of the first
            half), copied into this rank's fresh model before its step.
    """
    f, out = _round_trip_load(ctx, plan, directory)
    copy_buffers(f.model, volatile[ctx.rank], _volatile(plan))
    train_plan(f, plan.load, steps=1)
    out["stepped"] = gathered_state(f.model)
    end(f.strategy)
    return out


def join_round_trip(saving: dict[str, Any], loading: dict[str, Any]) -> dict[str, Any]:
    """One rank's outputs of both halves as :func:`round_trip_rank` returns them."""
    out = {k: v for k, v in saving.items() if k not in ("scheduler", "volatile", "stepped")}
    out.update({k: v for k, v in loading.items() if k not in ("scheduler", "stepped")})
    out["scheduler"] = {**loading["scheduler"], "saved": saving["scheduler"]}
    out["after_step"] = (saving["stepped"], loading["stepped"])
    return out


def _volatile(plan: CkptPlan) -> set[str]:
    plain = build_model(plan.load.model, "meta")
    return set(dict(plain.named_buffers())) - set(plain.state_dict())


def _round_trip_save(
    ctx: RankContext, plan: CkptPlan, directory: str, effects: bool
) -> tuple[Trained, Any, dict[str, Any]]:
    path = path_for(directory, plan.fmt)
    t = build(ctx, plan.save, plan.fmt)
    trained = train_plan(t, plan.save)
    # the scheduler comes after training (which runs at the scenario's rate, as TRAIN-1's
    # plain model does) and catches up with the optimizer's steps: the state it saves is
    # the state of a scheduler stepped alongside
    scheduler = make_scheduler(t.optimizer)
    step_scheduler(scheduler, plan.save.plan.steps)
    extra: dict[str, Any] = {}
    if effects:
        trained.rank = ctx.rank
        dtypes = {
            "params": sorted({str(p.dtype) for p in t.model.parameters()}),
            "optim": optimizer_state_dtypes(t.optimizer),
        }
        before = read_state(t)
        trained.state = before["model"]  # one gather serves TRAIN-1 and CKPT-SAVE-7
        extra = {"trained": trained, "before": before, "dtypes": dtypes}
    t.strategy.save_checkpoint(
        path,
        {
            "model": t.model,
            "optimizer": t.optimizer,
            SCHEDULER_KEY: scheduler,
            **make_metadata(plan.meta),
        },
    )
    read = read_unstepped if plan.save.plan.steps == 0 else read_state
    saved = read(t)  # after the save (which must not have stepped an optimizer without state)
    with clause("CKPT-BUF-1"):  # before the load, whose strict key check would meet them first
        check_no_saved_nonpersistent(ctx, plan, path)
    return t, scheduler, {"saved": saved, **extra}


def _round_trip_load(
    ctx: RankContext, plan: CkptPlan, directory: str
) -> tuple[Trained, dict[str, Any]]:
    path = path_for(directory, plan.fmt)
    f = build(ctx, plan.load, plan.fmt)
    fresh_scheduler = make_scheduler(f.optimizer)  # built before the load, as a trainer does
    state: dict[str, Any] = {
        "model": f.model,
        "optimizer": f.optimizer,
        SCHEDULER_KEY: fresh_scheduler,
        **fresh_metadata(plan.requested),
    }
    counter = state.get("counter")
    returned = f.strategy.load_checkpoint(path, state)
    read = read_unstepped if plan.save.plan.steps == 0 else read_state
    loaded = read(f)
    restored_scheduler = state.get(SCHEDULER_KEY)
    out = {
        "loaded": loaded,
        "restored": plain_metadata({k: state[k] for k in plan.requested}),
        "same_counter": counter is None or state["counter"] is counter,
        "returned": plain_metadata(dict(returned or {})),
        "volatile": nonpersistent_buffers(f.model, _volatile(plan)),
        "scheduler": {  # the caller's object after the load, whatever state[key] holds
            "loaded": read_scheduler(fresh_scheduler),
            "replaced_by": (
                None if restored_scheduler is fresh_scheduler else type(restored_scheduler).__name__
            ),
        },
    }
    return f, out
