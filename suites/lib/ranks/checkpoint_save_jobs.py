"""Rank side of what a save does beyond writing: a save that fails part-way loses nothing
(``test_checkpoint_atomic.py``: CKPT-SAVE-6) and a save changes nothing of the caller's
(``test_checkpoint_save_effects.py``: CKPT-SAVE-7).

The faulty save is a real fault: the rank that cannot write (:func:`faulty_rank`) gets a
file-size limit of one byte for the duration of ``save_checkpoint`` (:func:`_cannot_write`).
"""

from __future__ import annotations

import copy
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from suites.lib.ranks.checkpoint_jobs import build, path_for, read_state, train_plan
from suites.lib.ranks.training import end
from suites.lib.shared.checkpoint_specs import (
    CkptPlan,
    fresh_metadata,
    make_metadata,
    plain_metadata,
)

__all__ = [
    "faulty_rank",
    "faulty_save_rank",
    "load_old_rank",
    "save_changes_nothing_rank",
    "save_old_rank",
]


# --- a failed save (test_checkpoint_atomic.py) --------------------------------------------


@contextmanager
def _cannot_write(kill: bool) -> Iterator[None]:
    """This process may write no byte more; with ``kill`` the kernel kills it when it tries."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    core = resource.getrlimit(resource.RLIMIT_CORE)
    action = signal.signal(signal.SIGXFSZ, signal.SIG_DFL if kill else signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_CORE, (0, core[1]))  # a killed rank leaves no core file
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        resource.setrlimit(resource.RLIMIT_CORE, core)
        signal.signal(signal.SIGXFSZ, action)


def faulty_rank(fmt: str, world_size: int) -> int:
    """The rank that cannot write: rank 0 writes a full file, every rank writes its shard."""
    return 0 if fmt == "full" else world_size - 1


def save_old_rank(ctx: Any, plan: CkptPlan, path: str) -> dict[str, Any]:
    t = build(ctx, plan.save, plan.fmt)
    train_plan(t, plan.save)
    t.strategy.save_checkpoint(
        path, {"model": t.model, "optimizer": t.optimizer, **make_metadata(plan.meta)}
    )
    saved = read_state(t)
    end(t.strategy)
    return saved


def faulty_save_rank(ctx: Any, plan: CkptPlan, path: str, fault: str) -> str:
    t = build(ctx, plan.save, plan.fmt)
    train_plan(t, plan.save)
    train_plan(t, plan.save, steps=1)  # the new checkpoint would differ from the old one
    state = {"model": t.model, "optimizer": t.optimizer, **make_metadata(plan.meta)}
    faulty = ctx.rank == faulty_rank(plan.fmt, ctx.world_size)
    try:
        with _cannot_write(kill=fault == "rank_killed") if faulty else nullcontext():
            t.strategy.save_checkpoint(path, state)
    except BaseException as exc:  # CheckpointException is a BaseException
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        end(t.strategy)
    return "no error"


def load_old_rank(ctx: Any, plan: CkptPlan, path: str) -> dict[str, Any]:
    f = build(ctx, plan.load, plan.fmt)
    state = {"model": f.model, "optimizer": f.optimizer, **fresh_metadata(plan.requested)}
    f.strategy.load_checkpoint(path, state)
    loaded = read_state(f)
    end(f.strategy)
    return loaded


# --- a save changes nothing (test_checkpoint_save_effects.py) ----------------------------


def _flags(model: Any) -> dict[str, Any]:
    """What a save must not flip on the module: training mode and each ``requires_grad``."""
    return {
        "training": model.training,
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
    }


def save_changes_nothing_rank(ctx: Any, plan: CkptPlan, directory: str) -> dict[str, Any]:
    saver, twin = build(ctx, plan.save, plan.fmt), build(ctx, plan.save, plan.fmt)
    train_plan(saver, plan.save)
    train_plan(twin, plan.save)
    state: dict[str, Any] = {
        "model": saver.model,
        "optimizer": saver.optimizer,
        **make_metadata(plan.meta),
    }
    objects = dict(state)
    meta_before = copy.deepcopy(plain_metadata({k: state[k] for k in _meta_keys(state)}))
    flags_before = _flags(saver.model)
    before, _ = read_state(saver), read_state(twin)
    saver.strategy.save_checkpoint(path_for(directory, plan.fmt), state)
    after, _ = read_state(saver), read_state(twin)
    out = {
        "keys": (sorted(objects), sorted(state)),
        "replaced": sorted(k for k in objects if k in state and state[k] is not objects[k]),
        "meta": (meta_before, plain_metadata({k: state[k] for k in _meta_keys(state)})),
        "flags": (flags_before, _flags(saver.model)),
        "state": (before, after),
    }
    train_plan(saver, plan.save, steps=1)
    train_plan(twin, plan.save, steps=1)
    out["next_step"] = (read_state(saver), read_state(twin))
    end(saver.strategy)
    end(twin.strategy)
    return out


def _meta_keys(state: dict[str, Any]) -> list[str]:
    """The metadata entries of a ``state`` dict: everything but the module and optimizer."""
    return sorted(k for k in state if k not in ("model", "optimizer"))
