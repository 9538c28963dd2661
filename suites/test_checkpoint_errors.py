"""CONTRACT.md CKPT-SAVE-1, CKPT-SAVE-2, CKPT-SAVE-3 and CKPT-SAVE-5: error contracts of
``save_checkpoint``/``load_checkpoint``.

Each condition must raise the stated exception (an ``Exception``: torch's
``CheckpointException`` is a ``BaseException`` and must not reach the caller), with a message
that names the offending value or says what to do, and leave the files on disk as they were
(compared by content hash before and after). One job per test and family runs every
condition of the clause on every rank; the controller checks every rank's record.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import RankFailure, clause
from suites.lib.controller.checkpoint_checks import (
    assert_same_model,
    assert_same_optim,
    check_refusal,
)
from suites.lib.controller.dispatch import report, run
from suites.lib.controller.scenarios import job_world
from suites.lib.controller.written import check_written, judged_if_it_fails
from suites.lib.ranks.checkpoint_jobs import (
    ERROR_SPEC,
    error_scenario,
)
from suites.lib.ranks.checkpoint_refusal_jobs import (
    filter_rank,
    rank0_path_rank,
    replace_rank,
    save_contract_rank,
)
from suites.lib.shared.checkpoint_specs import ROUND_TRIP
from suites.lib.shared.models import build_model

FAMILIES = ["fsdp", "model_parallel", "fsdp2"]


def _run(job: Callable[..., Any], family: str, tmp_path: Path) -> list[Any]:
    """``job`` for ``family`` on every rank. The job builds its own small configuration of
    the family from the name (:func:`~suites.lib.ranks.checkpoint_jobs.error_scenario`), so
    the dispatch sees no scenario: the family is reported here, for the clause's coverage,
    as the dispatch reports a scenario's (also when the job ran and failed)."""
    try:
        outs = run(job, family, str(tmp_path), world_size=job_world())
    except RankFailure:
        report({"family": (family,)})
        raise
    report({"family": (family,)})
    return outs


@pytest.mark.clause("CKPT-SAVE-1")
@pytest.mark.parametrize("family", FAMILIES)
def test_save_needs_exactly_one_sharded_model(family: str, tmp_path: Path) -> None:
    for rank, out in enumerate(_run(save_contract_rank, family, tmp_path)):
        what = f"rank {rank} ({family})"
        check_refusal(
            out["none"], ("ValueError",), "CKPT-SAVE-1", f"{what}, no model", ("could not find",)
        )
        check_refusal(
            out["two"], ("ValueError",), "CKPT-SAVE-1", f"{what}, two models", ("multiple",)
        )
        check_refusal(out["storage"], ("TypeError",), "CKPT-SAVE-1", f"{what}, storage_options")
        assert not out["exists"], f"CKPT-SAVE-1: {what}: a refused save wrote a checkpoint"


@pytest.mark.clause("CKPT-SAVE-2")
@pytest.mark.parametrize("family", FAMILIES)
def test_ranks_passing_different_paths_write_rank0s(family: str, tmp_path: Path) -> None:
    scenario = error_scenario(family, job_world())
    written = {fmt: str(tmp_path / f"{fmt}-rank0") for fmt in ("full", "sharded")}
    size = scenario.world_size
    seen = {
        f: f"saved at world size {size} ({family}, {f}) to the path rank 0 passed" for f in written
    }
    # the job saves and loads: what rank 0 wrote is judged as written, not as the load met it
    with judged_if_it_fails("full", [(scenario, written["full"])], where=seen["full"]):
        with judged_if_it_fails("sharded", [(scenario, written["sharded"])], where=seen["sharded"]):
            outs = _run(rank0_path_rank, family, tmp_path)
    for rank, out in enumerate(outs):
        for fmt in ("full", "sharded"):
            what = f"CKPT-SAVE-2: rank {rank} ({family}, {fmt})"
            assert out[fmt]["listing"] == [f"{fmt}-rank0"], (
                f"{what}: every rank passed its own path; only rank 0's may be written, found "
                f"{out[fmt]['listing']}"
            )
            if rank == 0:
                check_written(scenario, fmt, written[fmt], where=seen[fmt])
            # whether what rank 0 wrote loads back is the round trip's clause, not this one's
            round_trip = ROUND_TRIP[fmt]
            at = f"rank {rank} ({family}, {fmt}), rank 0's checkpoint loaded"
            saved, loaded = out[fmt]["saved"], out[fmt]["loaded"]
            with clause(round_trip):
                assert_same_model(loaded["model"], saved["model"], clause=round_trip, where=at)
                assert_same_optim(loaded["optim"], saved["optim"], clause=round_trip, where=at)


@pytest.mark.clause("CKPT-SAVE-3")
@pytest.mark.parametrize("family", FAMILIES)
def test_save_replaces_checkpoints_and_refuses_other_directories(
    family: str, tmp_path: Path
) -> None:
    for rank, out in enumerate(_run(replace_rank, family, tmp_path)):
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


@pytest.mark.clause("CKPT-SAVE-5")
@pytest.mark.parametrize("family", FAMILIES)
def test_filter_selects_entries_of_full_saves_only(family: str, tmp_path: Path) -> None:
    every = sorted(build_model(ERROR_SPEC, "meta").state_dict())
    for rank, out in enumerate(_run(filter_rank, family, tmp_path)):
        what = f"rank {rank} ({family})"
        assert out["model"] == [k for k in every if not k.startswith("head.")], (
            f"CKPT-SAVE-5: {what}: the filtered full file's model holds {out['model']}"
        )
        assert out["nested"] == ["epoch", "lrs", "t"] and out["optimizer"], (
            f"CKPT-SAVE-5: {what}: other entries wrongly filtered: nested={out['nested']}"
        )
        whole = {"model": every, "nested": ["epoch", "lrs", "name", "t"], "optimizer": True}
        assert out["unfiltered"] == whole, (
            f"CKPT-SAVE-5: {what}: filter=None must keep every entry; the full file holds "
            f"{out['unfiltered']}"
        )
        check_refusal(
            out["sharded"],
            ("NotImplementedError",),
            "CKPT-SAVE-5",
            f"{what}, a filter with the sharded format",
        )
        assert not out["sharded_exists"], f"CKPT-SAVE-5: {what}: the refused save wrote files"
