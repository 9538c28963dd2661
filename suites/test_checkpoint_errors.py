"""CONTRACT.md CKPT-SAVE-1, CKPT-SAVE-2, CKPT-SAVE-3 and CKPT-SAVE-5: error contracts of
``save_checkpoint``/``load_checkpoint``.

Each condition must raise the stated exception (an ``Exception``: torch's
``CheckpointException`` is a ``BaseException`` and must not reach the caller), with a message
that names the offending value or says what to do, and leave the files on disk as they were
(compared by content hash before and after). One job per test and family runs every
condition of the clause on every rank; the controller checks every rank's record.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from suites.lib.controller.checkpoint_checks import check_refusal, tree_diff
from suites.lib.controller.dispatch import run
from suites.lib.controller.scenarios import job_world
from suites.lib.ranks.checkpoint_jobs import (
    ERROR_SPEC,
    attempt,
    build,
    error_scenario,
    read_state,
    train_plan,
)
from suites.lib.ranks.training import end
from suites.lib.shared.models import build_model

FAMILIES = ["fsdp", "model_parallel"]


def _save_contract_rank(ctx: Any, family: str, directory: str) -> dict[str, Any]:
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


@pytest.mark.clause("CKPT-SAVE-1")
@pytest.mark.parametrize("family", FAMILIES)
def test_save_needs_exactly_one_sharded_model(family: str, tmp_path: Path) -> None:
    for rank, out in enumerate(
        run(_save_contract_rank, family, str(tmp_path), world_size=job_world())
    ):
        what = f"rank {rank} ({family})"
        check_refusal(
            out["none"], ("ValueError",), "CKPT-SAVE-1", f"{what}, no model", ("could not find",)
        )
        check_refusal(
            out["two"], ("ValueError",), "CKPT-SAVE-1", f"{what}, two models", ("multiple",)
        )
        check_refusal(out["storage"], ("TypeError",), "CKPT-SAVE-1", f"{what}, storage_options")
        assert not out["exists"], f"CKPT-SAVE-1: {what}: a refused save wrote a checkpoint"


def _rank0_path_rank(ctx: Any, family: str, directory: str) -> dict[str, Any]:
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


@pytest.mark.clause("CKPT-SAVE-2")
@pytest.mark.parametrize("family", FAMILIES)
def test_ranks_passing_different_paths_write_rank0s(family: str, tmp_path: Path) -> None:
    for rank, out in enumerate(
        run(_rank0_path_rank, family, str(tmp_path), world_size=job_world())
    ):
        for fmt in ("full", "sharded"):
            what = f"CKPT-SAVE-2: rank {rank} ({family}, {fmt})"
            assert out[fmt]["listing"] == [f"{fmt}-rank0"], (
                f"{what}: every rank passed its own path; only rank 0's may be written, found "
                f"{out[fmt]['listing']}"
            )
            found = tree_diff(out[fmt]["loaded"], out[fmt]["saved"], "state")
            assert found is None, f"{what}: rank 0's checkpoint does not load back: {found}"


def _replace_rank(ctx: Any, family: str, directory: str) -> dict[str, Any]:
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


@pytest.mark.clause("CKPT-SAVE-3")
@pytest.mark.parametrize("family", FAMILIES)
def test_save_replaces_checkpoints_and_refuses_other_directories(
    family: str, tmp_path: Path
) -> None:
    for rank, out in enumerate(run(_replace_rank, family, str(tmp_path), world_size=job_world())):
        what = f"rank {rank} ({family})"
        assert out["full_over_sharded"], (
            f"CKPT-SAVE-3: {what}: a full save did not replace the sharded checkpoint at its path"
        )
        check_refusal(
            out["full_over_dir"],
            ("IsADirectoryError",),
            "CKPT-SAVE-3",
            f"{what}, full save onto a directory that is not a checkpoint",
        )
        assert out["dir_kept"], f"CKPT-SAVE-3: {what}: the user's directory was touched"
        assert out["sharded_over_file"], (
            f"CKPT-SAVE-3: {what}: a sharded save did not replace the file at its path"
        )


def _filter_rank(ctx: Any, family: str, directory: str) -> dict[str, Any]:
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
    never = os.path.join(directory, "never")
    out["sharded"] = attempt(
        lambda: sharded.strategy.save_checkpoint(never, {"model": sharded.model}, filter=keep),
        directory,
    )
    out["sharded_exists"] = os.path.exists(never)
    end(full.strategy)
    end(sharded.strategy)
    return out


@pytest.mark.clause("CKPT-SAVE-5")
@pytest.mark.parametrize("family", FAMILIES)
def test_filter_selects_entries_of_full_saves_only(family: str, tmp_path: Path) -> None:
    every = sorted(build_model(ERROR_SPEC, "meta").state_dict())
    for rank, out in enumerate(run(_filter_rank, family, str(tmp_path), world_size=job_world())):
        what = f"rank {rank} ({family})"
        assert out["model"] == [k for k in every if not k.startswith("head.")], (
            f"CKPT-SAVE-5: {what}: the filtered full file's model holds {out['model']}"
        )
        assert out["nested"] == ["epoch", "lrs", "t"] and out["optimizer"], (
            f"CKPT-SAVE-5: {what}: other entries wrongly filtered: nested={out['nested']}"
        )
        check_refusal(
            out["sharded"],
            ("NotImplementedError",),
            "CKPT-SAVE-5",
            f"{what}, a filter with the sharded format",
        )
        assert not out["sharded_exists"], f"CKPT-SAVE-5: {what}: the refused save wrote files"
