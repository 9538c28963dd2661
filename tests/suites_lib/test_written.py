"""A checkpoint judged as written (:mod:`suites.lib.controller.written`): small state dicts
written to ``tmp_path`` the way a full and a sharded save write them, no ranks."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from harness.conformance.findings.headlines import headline
from harness.conformance.findings.masking import difference
from harness.conformance.findings.signatures import attribute
from suites.lib.controller.written import (
    check_written,
    judged_if_it_fails,
    plain_at_save,
    read_written,
    written_difference,
)
from suites.lib.shared.models import BlockSpec, ModelSpec
from suites.lib.shared.specs import FSDPConfig, OptimSpec, Scenario, TrainPlan

#: the directories here are written by one process, as DCP's own warning assumes
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

SPEC = ModelSpec(hidden=4, blocks=(BlockSpec(ffn=4),), in_features=3, out=2, scale=True, seed=5)
SCENARIO = Scenario(2, SPEC, FSDPConfig(), OptimSpec("adam", lr=0.01), TrainPlan(steps=2))


def _content() -> dict[str, Any]:
    """What a right save of :data:`SCENARIO` holds: the plain model and optimizer state."""
    plain = plain_at_save(SCENARIO)
    return {"model": copy.deepcopy(plain.model), "optimizer": copy.deepcopy(plain.optim)}


def _full(tmp_path: Path, content: dict[str, Any]) -> str:
    path = str(tmp_path / "ckpt.pt")
    torch.save(content, path)
    return path


def _first_bias(content: dict[str, Any]) -> str:
    return next(n for n in sorted(content["optimizer"]["state"]) if n.endswith("bias"))


def test_a_right_full_file_and_a_right_sharded_directory_pass(tmp_path: Path) -> None:
    check_written(SCENARIO, "full", _full(tmp_path, _content()))
    directory = str(tmp_path / "ckpt")
    dcp.save(_content(), checkpoint_id=directory, no_dist=True)
    assert read_written(directory, "sharded") is not None
    check_written(SCENARIO, "sharded", directory)


def test_an_optimizer_entry_of_another_shape_names_the_entry_and_both_shapes(
    tmp_path: Path,
) -> None:
    content = _content()
    name = _first_bias(content)
    content["optimizer"]["state"][name]["exp_avg"] = torch.zeros(1)
    with pytest.raises(AssertionError) as info:
        check_written(SCENARIO, "full", _full(tmp_path, content), where="saved at world size 2")
    message = str(info.value)
    entry = f"optimizer['state'][{name!r}]['exp_avg']"
    # what differs first in the headline, where it was seen after it
    assert headline(message) == (
        f"CKPT-RT-1: the full checkpoint as written holds {entry}: shape (1,) where the plain "
        "optimizer holds shape (4,) (saved at world size 2)"
    ), message
    # the finding's key: the same wrong entry whichever parameter, family or check showed it
    assert difference(message) == (
        "optimizer['state'][…]: shape (N,) where the plain optimizer holds shape (N,)"
    )
    assert attribute(info.value).clause == "CKPT-RT-1"


def test_a_sharded_directory_is_judged_under_the_sharded_round_trip(tmp_path: Path) -> None:
    content = _content()
    name = _first_bias(content)
    content["optimizer"]["state"][name]["exp_avg_sq"] = torch.zeros(2)
    directory = str(tmp_path / "ckpt")
    dcp.save(content, checkpoint_id=directory, no_dist=True)
    with pytest.raises(AssertionError, match=r"^CKPT-RT-2: the sharded checkpoint as written"):
        check_written(SCENARIO, "sharded", directory)


@pytest.mark.parametrize(
    "change,clause,words",
    [
        (lambda c: c["model"].pop("scale.scale"), "CKPT-BUF-1", "lacks model['scale.scale']"),
        (
            lambda c: c["model"].__setitem__("scale.scale", c["model"]["scale.scale"].bfloat16()),
            "PREC-4",
            "torch.bfloat16 where the plain model holds torch.float32",
        ),
        (
            lambda c: c["model"].__setitem__("scale.offset", torch.zeros(4)),
            "CKPT-BUF-1",
            "a non-persistent buffer",
        ),
        (
            lambda c: c["model"].__setitem__(
                "_fsdp_wrapped_module.head.bias", c["model"].pop("head.bias")
            ),
            "CKPT-REKEY-2",
            "a wrapper's name where the plain model's state_dict() has 'head.bias'",
        ),
        (
            lambda c: c["model"]["head.bias"].add_(1.0),
            "CKPT-RT-1",
            "elements differ",
        ),
        (
            lambda c: c["optimizer"]["state"].pop(_first_bias(c)),
            "CKPT-RT-1",
            "the plain optimizer holds ['exp_avg', 'exp_avg_sq', 'step'] for it",
        ),
        (
            lambda c: c["optimizer"]["state"][_first_bias(c)].__setitem__(
                "step", torch.tensor(5.0)
            ),
            "CKPT-RT-1",
            "step 5 where the plain optimizer holds step 2",
        ),
        (
            lambda c: c["optimizer"].__setitem__(
                "state", dict(enumerate(c["optimizer"]["state"].values()))
            ),
            "CKPT-REKEY-2",
            "keyed by an integer id",
        ),
    ],
    ids=[
        "buffer-missing",
        "buffer-dtype",
        "nonpersistent",
        "wrapper-name",
        "value",
        "no-state",
        "step",
        "integer-ids",
    ],
)
def test_each_difference_is_told_under_its_clause(change: Any, clause: str, words: str) -> None:
    content = _content()
    change(content)
    found = written_difference(content, plain_at_save(SCENARIO), "full")
    assert found is not None
    assert found.clause == clause, found
    assert words in found.message("full"), found.message("full")


def test_a_save_before_the_first_step_holds_no_optimizer_state() -> None:
    scenario = Scenario(2, SPEC, FSDPConfig(), OptimSpec("adam", lr=0.01), TrainPlan(steps=0))
    plain = plain_at_save(scenario)
    assert plain.optim["state"] == {}
    content = {"model": dict(plain.model), "optimizer": copy.deepcopy(plain.optim)}
    assert written_difference(content, plain, "full") is None
    content["optimizer"]["state"] = {"head.bias": {"step": torch.tensor(1.0)}}
    found = written_difference(content, plain, "full")
    assert found is not None and "where the plain optimizer holds none" in found.what


def test_a_checkpoint_that_cannot_be_read_so_is_left_to_the_load(tmp_path: Path) -> None:
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert read_written(str(tmp_path / "ckpt.pt"), "full") is None
    check_written(SCENARIO, "full", str(tmp_path / "ckpt.pt"))  # nothing raised
    assert read_written(str(tmp_path / "missing"), "sharded") is None


def test_a_sharded_save_before_the_first_step_has_no_state_entry(tmp_path: Path) -> None:
    """DCP writes nothing for an empty container: the directory of an optimizer that never
    stepped holds its groups only, as the plain optimizer's state_dict() (state {})."""
    scenario = Scenario(2, SPEC, FSDPConfig(), OptimSpec("adam", lr=0.01), TrainPlan(steps=0))
    plain = plain_at_save(scenario)
    directory = str(tmp_path / "ckpt")
    dcp.save(
        {"model": plain.model, "optimizer": plain.optim}, checkpoint_id=directory, no_dist=True
    )
    content = read_written(directory, "sharded")
    assert content is not None and "state" not in content["optimizer"]
    check_written(scenario, "sharded", directory)


def test_a_job_that_failed_on_a_wrong_file_fails_with_the_files_difference(tmp_path: Path) -> None:
    content = _content()
    content["optimizer"]["state"][_first_bias(content)]["exp_avg"] = torch.zeros(1)
    path = _full(tmp_path, content)
    with pytest.raises(AssertionError, match=r"^CKPT-RT-1: .*as written holds optimizer") as info:
        with judged_if_it_fails("full", [(SCENARIO, path)]):
            raise RuntimeError("Expected device to be set")  # what the load met
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_job_that_failed_with_a_right_file_or_none_fails_as_it_did(tmp_path: Path) -> None:
    right = _full(tmp_path, _content())
    for saves in ([(SCENARIO, right)], [(SCENARIO, str(tmp_path / "never-written.pt"))]):
        with pytest.raises(RuntimeError, match="a bug of the load"):
            with judged_if_it_fails("full", saves):
                raise RuntimeError("a bug of the load")


def test_a_sharded_directory_is_judged_on_what_the_offline_reader_finds(tmp_path: Path) -> None:
    """A strategy that keeps its optimizer in files of its own beside the DCP directory:
    the directory's model is judged, the optimizer left to the load (and to CKPT-RT-4)."""
    content = _content()
    directory = str(tmp_path / "ckpt")
    dcp.save({"model": content["model"]}, checkpoint_id=directory, no_dist=True)
    check_written(SCENARIO, "sharded", directory)
    content["model"]["head.bias"] = torch.zeros(7)
    dcp.save({"model": content["model"]}, checkpoint_id=str(tmp_path / "bad"), no_dist=True)
    with pytest.raises(AssertionError, match=r"holds model\['head.bias'\]: shape \(7,\)"):
        check_written(SCENARIO, "sharded", str(tmp_path / "bad"))
    full = _content()
    del full["optimizer"]
    found = written_difference(full, plain_at_save(SCENARIO), "full")
    assert found is not None and found.clause == "CKPT-RT-1"  # a full file is all there is


def test_a_job_the_plain_replay_does_not_follow_is_judged_on_the_models_entries(
    tmp_path: Path,
) -> None:
    """values=False (the list-of-optimizers job trains two optimizers): other values and no
    optimizer pass, a model entry of another shape fails the job with the entry named."""
    content = _content()
    model = {k: v + 1.0 for k, v in content["model"].items()}  # trained otherwise
    directory = str(tmp_path / "ckpt")
    dcp.save({"model": model}, checkpoint_id=directory, no_dist=True)
    with pytest.raises(RuntimeError, match="the load failed"):
        with judged_if_it_fails("sharded", [(SCENARIO, directory)], values=False):
            raise RuntimeError("the load failed")
    name = next(n for n in sorted(model) if n.endswith("bias"))
    model[name] = model[name][:1]  # one rank's shard under the whole parameter's name
    wrong = str(tmp_path / "wrong")
    dcp.save({"model": model}, checkpoint_id=wrong, no_dist=True)
    with pytest.raises(AssertionError) as info:
        with judged_if_it_fails("sharded", [(SCENARIO, wrong)], values=False):
            raise RuntimeError("the load failed")
    message = str(info.value)
    assert f"the sharded checkpoint as written holds model['{name}']: shape (1,)" in message
    assert "where the plain model holds shape (" in message
