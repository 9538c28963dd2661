"""Rank side of the checkpoint error contracts: what ``save_checkpoint`` refuses and how it
treats paths (``test_checkpoint_errors.py``: CKPT-SAVE-1, -2, -3, -5), what
``load_checkpoint`` refuses and never unpickles (``test_checkpoint_load_errors.py``:
CKPT-LOAD-1, CKPT-SEC-1), and strict and non-strict loading
(``test_checkpoint_strict.py``: CKPT-STRICT-1, -2).

Each job records every condition with :func:`suites.lib.ranks.checkpoint_jobs.attempt` (what
was raised, whether the files on disk changed); the controller checks every rank's record.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from suites.lib.ranks.checkpoint_jobs import (
    ERROR_SPEC,
    attempt,
    build,
    error_scenario,
    read_state,
    train_plan,
)
from suites.lib.ranks.training import end
from suites.lib.shared.arguments import arguments, passes
from suites.lib.shared.checkpoint_specs import CkptPlan
from suites.lib.shared.files import files_digest
from suites.lib.shared.models import ModelSpec, build_model

__all__ = [
    "filter_rank",
    "load_contract_rank",
    "non_strict_rank",
    "rank0_path_rank",
    "replace_rank",
    "save_contract_rank",
    "strict_rank",
    "unpickling_rank",
]


# --- save_checkpoint (test_checkpoint_errors.py) -----------------------------------------


@passes(lambda family, directory: arguments(storage_options=(None, {"x": 1})))
def save_contract_rank(ctx: Any, family: str, directory: str) -> dict[str, Any]:
    t = build(ctx, error_scenario(family, ctx.world_size), "sharded")
    other = t.strategy.setup_module(build_model(ERROR_SPEC))
    path = os.path.join(directory, "never")
    save = t.strategy.save_checkpoint
    out = {
        "none": attempt(lambda: save(path, {"optimizer": t.optimizer, "step": 1}), directory),
        "two": attempt(lambda: save(path, {"a": t.model, "b": other}), directory),
        "storage": attempt(
            lambda: save(path, {"model": t.model}, storage_options={"x": 1}), directory
        ),
        "exists": os.path.exists(path),
    }
    end(t.strategy)
    return out


def rank0_path_rank(ctx: Any, family: str, directory: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fmt in ("full", "sharded"):
        t = build(ctx, error_scenario(family, ctx.world_size), fmt)
        train_plan(t, error_scenario(family, ctx.world_size))
        mine = os.path.join(directory, f"{fmt}-rank{ctx.rank}")
        t.strategy.save_checkpoint(mine, {"model": t.model, "optimizer": t.optimizer})
        t.strategy.barrier()
        out[fmt] = {
            "listing": sorted(n for n in os.listdir(directory) if n.startswith(fmt)),
            "saved": read_state(t),
        }
        f = build(ctx, error_scenario(family, ctx.world_size), fmt)
        f.strategy.load_checkpoint(
            os.path.join(directory, f"{fmt}-rank0"), {"model": f.model, "optimizer": f.optimizer}
        )
        out[fmt]["loaded"] = read_state(f)
        end(t.strategy)
        end(f.strategy)
    return out


def replace_rank(ctx: Any, family: str, directory: str) -> dict[str, Any]:
    full, sharded = (
        build(ctx, error_scenario(family, ctx.world_size), "full"),
        build(ctx, error_scenario(family, ctx.world_size), "sharded"),
    )
    target = os.path.join(directory, "target")
    sharded.strategy.save_checkpoint(target, {"model": sharded.model})
    full.strategy.save_checkpoint(target, {"model": full.model, "step": 1})
    out: dict[str, Any] = {"full_over_sharded": os.path.isfile(target)}
    plain_dir = os.path.join(directory, "plain_dir")
    if ctx.rank == 0:
        os.makedirs(plain_dir)
        Path(plain_dir, "keep.txt").write_text("user data")
    full.strategy.barrier()
    out["full_over_dir"] = attempt(
        lambda: full.strategy.save_checkpoint(plain_dir, {"model": full.model}), plain_dir
    )
    out["dir_kept"] = Path(plain_dir, "keep.txt").read_text() == "user data"
    a_file = os.path.join(directory, "a_file")
    if ctx.rank == 0:
        Path(a_file).write_bytes(b"not a checkpoint")
    full.strategy.barrier()
    sharded.strategy.save_checkpoint(a_file, {"model": sharded.model})
    out["sharded_over_file"] = os.path.isdir(a_file) and os.path.isfile(
        os.path.join(a_file, ".metadata")
    )
    end(full.strategy)
    end(sharded.strategy)
    return out


@passes(lambda family, directory: arguments(filter=(None, "given")))
def filter_rank(ctx: Any, family: str, directory: str) -> dict[str, Any]:
    from suites.lib.shared.checkpoint_specs import make_metadata

    full, sharded = (
        build(ctx, error_scenario(family, ctx.world_size), "full"),
        build(ctx, error_scenario(family, ctx.world_size), "sharded"),
    )
    path = os.path.join(directory, "filtered.pt")
    keep = {
        "model": lambda name, value: not name.startswith("head."),
        "nested": lambda name, value: name != "name",
    }
    state = {"model": full.model, "optimizer": full.optimizer, **make_metadata(("nested",))}
    full.strategy.save_checkpoint(path, state, filter=keep)
    content = torch.load(path, weights_only=True)
    out: dict[str, Any] = {
        "model": sorted(content["model"]),
        "nested": sorted(content["nested"]),
        "optimizer": "optimizer" in content,
    }
    whole = os.path.join(directory, "whole.pt")
    full.strategy.save_checkpoint(whole, state, filter=None)  # the default: keeps everything
    content = torch.load(whole, weights_only=True)
    out["unfiltered"] = {
        "model": sorted(content["model"]),
        "nested": sorted(content["nested"]),
        "optimizer": "optimizer" in content,
    }
    never = os.path.join(directory, "never")
    out["sharded"] = attempt(
        lambda: sharded.strategy.save_checkpoint(never, {"model": sharded.model}, filter=keep),
        directory,
    )
    out["sharded_exists"] = os.path.exists(never)
    end(full.strategy)
    end(sharded.strategy)
    return out


# --- load_checkpoint (test_checkpoint_load_errors.py) ------------------------------------


def touch(path: str) -> None:
    """What unpickling a :class:`Payload` would run: create ``path``."""
    Path(path).write_text("arbitrary code ran while loading a checkpoint")


class Payload:
    """An object whose unpickling runs code (:func:`touch`): loading must refuse it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return touch, (self.marker,)


def as_written(directory: str) -> str:
    """Where :func:`load_contract_rank` keeps a copy of its sharded save as written."""
    return os.path.join(directory, "sharded-as-written")


def load_contract_rank(ctx: Any, family: str, directory: str, bare: str) -> dict[str, Any]:
    t = build(ctx, error_scenario(family, ctx.world_size), "sharded")
    sharded = os.path.join(directory, "sharded")
    t.strategy.save_checkpoint(sharded, {"model": t.model, "optimizer": t.optimizer})
    load = t.strategy.load_checkpoint
    plain_dir = os.path.join(directory, "plain_dir")
    if ctx.rank == 0:
        os.makedirs(plain_dir, exist_ok=True)
        # the directory as the save wrote it, before a shard is torn below: the controller
        # judges it as written when a load here fails (see suites.lib.controller.written)
        shutil.copytree(sharded, as_written(directory))
    t.strategy.barrier()
    missing = os.path.join(directory, "missing")
    out: dict[str, Any] = {
        "empty": attempt(lambda: load(sharded, {}), directory),
        "optimizer": attempt(lambda: load(sharded, t.optimizer), directory),
        "bare_dir": attempt(lambda: load(sharded, t.model), directory),
        "missing": attempt(lambda: load(missing, {"model": t.model}), directory),
        "plain_dir": attempt(lambda: load(plain_dir, {"model": t.model}), directory),
    }
    out["missing_path"], out["plain_dir_path"] = missing, plain_dir
    load(bare, t.model)  # a file holding torch.save(model.state_dict()) itself
    out["bare"] = read_state(t)["model"]
    if ctx.rank == 0:  # break one shard file: torch.distributed.checkpoint fails to read it
        shard = sorted(Path(sharded).glob("*.distcp"))[0]
        shard.write_bytes(shard.read_bytes()[:16])
    t.strategy.barrier()
    out["torn"] = attempt(lambda: load(sharded, {"model": t.model}), directory)
    end(t.strategy)
    return out


def unpickling_rank(ctx: Any, family: str, directory: str, marker: str) -> dict[str, Any]:
    full, sharded = (
        build(ctx, error_scenario(family, ctx.world_size), fmt) for fmt in ("full", "sharded")
    )
    os.makedirs(directory, exist_ok=True)  # a save need not create its path's parent
    paths = {
        "full": os.path.join(directory, "full.pt"),
        "sharded": os.path.join(directory, "sharded"),
        "bare": os.path.join(directory, "bare.pt"),
    }
    full.strategy.save_checkpoint(paths["full"], {"model": full.model, "step": 3})
    sharded.strategy.save_checkpoint(paths["sharded"], {"model": sharded.model, "step": 3})
    if ctx.rank == 0:  # plant an object whose unpickling runs code, in each kind of file
        content = torch.load(paths["full"], weights_only=True)
        torch.save({**content, "step": Payload(marker)}, paths["full"])
        torch.save({"step": Payload(marker)}, os.path.join(paths["sharded"], "meta.pt"))
        torch.save({**content["model"], "extra": Payload(marker)}, paths["bare"])
    full.strategy.barrier()
    out = {
        "full": attempt(
            lambda: full.strategy.load_checkpoint(paths["full"], {"model": full.model}), directory
        ),
        "sharded": attempt(
            lambda: sharded.strategy.load_checkpoint(paths["sharded"], {"model": sharded.model}),
            directory,
        ),
        "bare": attempt(
            lambda: full.strategy.load_checkpoint(paths["bare"], full.model), directory
        ),
        "ran": os.path.exists(marker),
        "digest": files_digest(directory),
    }
    end(full.strategy)
    end(sharded.strategy)
    return out


# --- strict and non-strict loading (test_checkpoint_strict.py) ---------------------------

OTHER_GROUPS = {"one": "by_depth", "by_depth": "by_kind", "by_kind": "one"}


def _two_checkpoints(
    ctx: Any, plan: CkptPlan, directory: str, models: tuple[ModelSpec, ModelSpec]
) -> tuple[Any, Any, str, str]:
    """``a`` (no Scale keys, saving seed) and ``b`` (Scale keys, fresh seed), each trained
    and saved: model, optimizer and ``{"step": 7}``. ``models`` are their models, which the
    controller derives from ``plan.save`` and ``plan.load``."""
    a = build(ctx, dataclasses.replace(plan.save, model=models[0]), plan.fmt)
    b = build(ctx, dataclasses.replace(plan.load, model=models[1]), plan.fmt)
    paths = []
    for name, t in (("without", a), ("with", b)):
        train_plan(t, plan.save)
        path = os.path.join(directory, f"{name}.pt" if plan.fmt == "full" else name)
        t.strategy.save_checkpoint(path, {"model": t.model, "optimizer": t.optimizer, "step": 7})
        paths.append(path)
    return a, b, paths[0], paths[1]


@passes(lambda plan, directory, models: arguments(strict=True))
def strict_rank(
    ctx: Any, plan: CkptPlan, directory: str, models: tuple[ModelSpec, ModelSpec]
) -> dict[str, Any]:
    a, b, without, with_ = _two_checkpoints(ctx, plan, directory, models)
    out = {
        "missing": attempt(
            lambda: b.strategy.load_checkpoint(without, {"model": b.model}), directory
        ),
        "unexpected": attempt(
            lambda: a.strategy.load_checkpoint(with_, {"model": a.model}), directory
        ),
        "meta": attempt(
            lambda: a.strategy.load_checkpoint(without, {"model": a.model, "absent": 1}), directory
        ),
    }
    end(a.strategy)
    end(b.strategy)
    return out


@passes(lambda plan, directory, models: arguments(strict=False))
def non_strict_rank(
    ctx: Any, plan: CkptPlan, directory: str, models: tuple[ModelSpec, ModelSpec]
) -> dict[str, Any]:
    a, b, without, with_ = _two_checkpoints(ctx, plan, directory, models)
    saved_a, saved_b = read_state(a)["model"], read_state(b)["model"]
    state: dict[str, Any] = {"model": b.model, "step": -1, "absent": "kept"}
    out: dict[str, Any] = {
        "saved_a": saved_a,
        "saved_b": saved_b,
        "missing": attempt(
            lambda: b.strategy.load_checkpoint(without, state, strict=False), directory
        ),
    }
    out["b"], out["step"], out["absent"] = read_state(b)["model"], state["step"], state["absent"]
    out["unexpected"] = attempt(
        lambda: a.strategy.load_checkpoint(with_, {"model": a.model}, strict=False), directory
    )
    out["a"] = read_state(a)["model"]
    other = dataclasses.replace(plan.save.optim, groups=OTHER_GROUPS[plan.save.optim.groups])
    regrouped = a.strategy.setup_optimizer(other.build(a.model.named_parameters()))
    out["groups"] = attempt(
        lambda: a.strategy.load_checkpoint(
            without, {"model": a.model, "optimizer": regrouped}, strict=False
        ),
        directory,
    )
    end(a.strategy)
    end(b.strategy)
    return out
