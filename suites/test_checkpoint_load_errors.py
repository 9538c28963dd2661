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
from suites.lib.controller.written import judged_if_it_fails
from suites.lib.ranks.checkpoint_jobs import ERROR_SPEC, error_scenario
from suites.lib.ranks.checkpoint_refusal_jobs import (
    as_written,
    load_contract_rank,
    unpickling_rank,
)
from suites.lib.shared.models import build_model

FAMILIES = ["fsdp", "model_parallel", "fsdp2"]


@pytest.mark.clause("CKPT-LOAD-1")
@pytest.mark.parametrize("family", FAMILIES)
def test_load_refuses_what_it_cannot_load(family: str, tmp_path: Path) -> None:
    bare = str(tmp_path / "weights.pt")
    torch.save(build_model(ERROR_SPEC).state_dict(), bare)
    directory, world = str(tmp_path / "ckpts"), job_world()
    saved = error_scenario(family, world)
    seen = f"saved at world size {world} ({family}, sharded)"
    # a refusal met on a wrong file is the file's finding: when a check here fails, the
    # directory is judged as written, by its entries (the job saves before any step, where
    # the scenario's plan would train: the plain replay's values are not the file's)
    with judged_if_it_fails("sharded", [(saved, as_written(directory))], where=seen, values=False):
        results = run(load_contract_rank, family, directory, bare, world_size=world)
        _check_refusals(family, results, build_model(ERROR_SPEC).state_dict())


def _check_refusals(family: str, results: list[dict[str, Any]], expected: dict[str, Any]) -> None:
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


@pytest.mark.clause("CKPT-SEC-1")
@pytest.mark.parametrize("family", FAMILIES)
def test_load_never_unpickles_arbitrary_objects(family: str, tmp_path: Path) -> None:
    marker = str(tmp_path / "code-ran")
    results = run(unpickling_rank, family, str(tmp_path / "ckpts"), marker, world_size=job_world())
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
