"""CONTRACT.md section 5: what ``load_checkpoint`` refuses (CKPT-LOAD-1) and never unpickles
(CKPT-SEC-1). Every refusal is an ``Exception`` of the stated type that names the path or
says what to do, and leaves the files on disk unchanged.
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
from suites.lib.ranks.checkpoint_jobs import ERROR_SPEC, attempt, build, error_scenario, read_state
from suites.lib.ranks.training import end
from suites.lib.shared.files import files_digest
from suites.lib.shared.models import build_model

FAMILIES = ["fsdp", "model_parallel"]


def touch(path: str) -> None:
    """What unpickling a :class:`Payload` would run: create ``path``."""
    Path(path).write_text("arbitrary code ran while loading a checkpoint")


class Payload:
    """An object whose unpickling runs code (:func:`touch`): loading must refuse it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return touch, (self.marker,)


def _load_contract_rank(ctx: Any, family: str, directory: str, bare: str) -> dict[str, Any]:
    t = build(ctx, error_scenario(family, ctx.world_size), "sharded")
    sharded = os.path.join(directory, "sharded")
    t.strategy.save_checkpoint(sharded, {"model": t.model, "optimizer": t.optimizer})
    load = t.strategy.load_checkpoint
    plain_dir = os.path.join(directory, "plain_dir")
    if ctx.rank == 0:
        os.makedirs(plain_dir, exist_ok=True)
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


@pytest.mark.clause("CKPT-LOAD-1")
@pytest.mark.parametrize("family", FAMILIES)
def test_load_refuses_what_it_cannot_load(family: str, tmp_path: Path) -> None:
    bare = str(tmp_path / "weights.pt")
    expected = build_model(ERROR_SPEC).state_dict()
    torch.save(expected, bare)
    results = run(
        _load_contract_rank, family, str(tmp_path / "ckpts"), bare, world_size=job_world()
    )
    for rank, out in enumerate(results):
        what = f"rank {rank} ({family})"
        check_refusal(out["empty"], ("ValueError",), "CKPT-LOAD-1", f"{what}, state={{}}")
        check_refusal(
            out["optimizer"], ("NotImplementedError",), "CKPT-LOAD-1", f"{what}, bare optimizer"
        )
        check_refusal(
            out["bare_dir"], ("ValueError",), "CKPT-LOAD-1", f"{what}, bare module from a directory"
        )
        for key in ("missing", "plain_dir"):
            check_refusal(
                out[key],
                ("ValueError",),
                "CKPT-LOAD-1",
                f"{what}, a path that is no checkpoint ({key})",
                (os.path.basename(out[f"{key}_path"]),),
            )
        found = tree_diff(out["bare"], expected, "bare module")
        assert found is None, f"CKPT-LOAD-1: {what}: a bare module did not load its file: {found}"
        check_refusal(
            out["torn"],
            ("RuntimeError",),
            "CKPT-LOAD-1",
            f"{what}, a sharded checkpoint with a torn shard file",
        )


def _unpickling_rank(ctx: Any, family: str, directory: str, marker: str) -> dict[str, Any]:
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


@pytest.mark.clause("CKPT-SEC-1")
@pytest.mark.parametrize("family", FAMILIES)
def test_load_never_unpickles_arbitrary_objects(family: str, tmp_path: Path) -> None:
    marker = str(tmp_path / "code-ran")
    results = run(_unpickling_rank, family, str(tmp_path / "ckpts"), marker, world_size=job_world())
    for rank, out in enumerate(results):
        for key in ("full", "sharded", "bare"):
            what = f"rank {rank} ({family}), a {key} checkpoint holding a pickled object"
            check_refusal(out[key], ("Exception",), "CKPT-SEC-1", what)
            message = out[key]["message"].lower()
            assert any(w in message for w in ("weights_only", "unpickl", "pickle")), (
                f"CKPT-SEC-1: {what}: the refusal {out[key]['message']!r} does not say that "
                "the file needs arbitrary unpickling"
            )
        assert not out["ran"] and not os.path.exists(marker), (
            f"CKPT-SEC-1: rank {rank} ({family}): loading ran code from the checkpoint"
        )
