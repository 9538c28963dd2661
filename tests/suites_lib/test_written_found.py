"""What a checkpoint judged as written was found right in (the words a failed load then leads
with), and the resume machine's judgment against a plain model that lives in the controller
(:mod:`suites.lib.controller.written_live`). Small files in ``tmp_path``, no ranks."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from harness.conformance.findings.headlines import headline
from harness.conformance.findings.masking import difference
from harness.verdicts.checked_file import checked_file_of
from suites.lib.controller.tolerances import tolerance
from suites.lib.controller.written import check_written, judged_if_it_fails, plain_at_save
from suites.lib.controller.written_live import check_written_now, plain_now
from suites.lib.shared.models import BlockSpec, ModelSpec, build_model
from suites.lib.shared.specs import FSDPConfig, OptimSpec, Scenario, TrainPlan

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

SPEC = ModelSpec(hidden=4, blocks=(BlockSpec(ffn=4),), in_features=3, out=2, scale=True, seed=5)
SCENARIO = Scenario(2, SPEC, FSDPConfig(), OptimSpec("adam", lr=0.01), TrainPlan(steps=2))
FULL_RIGHT = "the full checkpoint as written matches the plain model and optimizer"


def _content() -> dict[str, Any]:
    plain = plain_at_save(SCENARIO)
    return {"model": copy.deepcopy(plain.model), "optimizer": copy.deepcopy(plain.optim)}


def _full(tmp_path: Path, content: dict[str, Any], name: str = "ckpt.pt") -> str:
    path = str(tmp_path / name)
    torch.save(content, path)
    return path


def test_check_written_says_what_it_found_right(tmp_path: Path) -> None:
    assert check_written(SCENARIO, "full", _full(tmp_path, _content())) == FULL_RIGHT
    model_only = str(tmp_path / "sharded")
    dcp.save({"model": _content()["model"]}, checkpoint_id=model_only, no_dist=True)
    assert check_written(SCENARIO, "sharded", model_only) == (
        "the sharded checkpoint as written matches the plain model"
    )
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert check_written(SCENARIO, "full", str(tmp_path / "junk.pt")) == ""


def test_a_job_that_failed_after_right_files_carries_what_was_found_right(tmp_path: Path) -> None:
    right = _full(tmp_path, _content())
    with pytest.raises(KeyError) as info, judged_if_it_fails("full", [(SCENARIO, right)]):
        raise KeyError("param_groups")  # the load's own bug
    assert checked_file_of(info.value) == FULL_RIGHT
    missing = [(SCENARIO, right), (SCENARIO, str(tmp_path / "never-written.pt"))]
    with pytest.raises(KeyError) as info, judged_if_it_fails("full", missing):
        raise KeyError("param_groups")
    assert checked_file_of(info.value) == ""  # one checkpoint was never read: nothing said


def _never_stepped() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_model(SPEC)
    return model, SCENARIO.optim.build(model.named_parameters())


def test_a_save_before_the_first_step_that_holds_adams_state_fails_as_written(
    tmp_path: Path,
) -> None:
    """The resume machine's first save, before any step: the plain optimizer has no state;
    a file that holds Adam's (what torch's reader creates) is wrong as written, with the
    round trip's difference (one finding with the moments' check)."""
    model, optimizer = _never_stepped()
    plain = plain_now(model, optimizer, SPEC, "32-true", tolerance("32-true", "adam"))
    assert (
        check_written_now(
            plain, "full", _full(tmp_path, {"model": plain.model, "optimizer": plain.optim})
        )
        == FULL_RIGHT
    )
    created = copy.deepcopy(plain.optim)
    name = sorted(created["param_groups"][0]["params"])[0]
    created["state"] = {name: {"step": torch.tensor(0.0), "exp_avg": torch.zeros(1)}}
    path = _full(tmp_path, {"model": plain.model, "optimizer": created}, "adam.pt")
    where = "saved at world size 2 (fsdp, full) after 0 steps"
    with pytest.raises(AssertionError) as info:
        check_written_now(plain, "full", path, where=where)
    message = str(info.value)
    assert message.startswith(f"CKPT-RT-1: {where}: the full checkpoint as written holds ")
    assert headline(message).startswith(
        f"CKPT-RT-1: the full checkpoint as written holds optimizer['state'][{name!r}]: state "
    )
    moments = (
        "CKPT-RT-2: saved at world size 2 (model_parallel, sharded): the sharded checkpoint "
        "as written holds optimizer['state']['head.bias']: state ['exp_avg', 'exp_avg_sq', "
        "'step'] where the plain optimizer holds none (a parameter that never stepped, or a "
        "frozen one)"
    )
    assert difference(message) == difference(moments)
