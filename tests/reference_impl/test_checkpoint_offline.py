"""Checkpoint code that needs no process group: the converter, bare plain modules, and the
refusal of files that need arbitrary unpickling (CKPT-SEC-1), DCP directories included."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from reference_impl.checkpoint import convert_sharded_to_full, load_checkpoint
from reference_impl.checkpoint.dcp_io import SafeReader

REPO = Path(__file__).resolve().parents[2]


class Opaque:
    """Not loadable with weights_only=True."""


def unsafe_dcp(path: Path) -> None:
    """A DCP directory (single process) whose non-tensor entry holds an arbitrary object."""
    state = {
        "model": {"w": torch.ones(2)},
        "optimizer": {"state": {}, "param_groups": [{"params": ["w"], "evil": Opaque()}]},
    }
    dcp.save(state, checkpoint_id=path, no_dist=True)


def test_converter_refuses_bad_input(tmp_path: Path) -> None:
    """Clear errors naming the path; nothing written."""
    with pytest.raises(ValueError, match="not a sharded checkpoint"):
        convert_sharded_to_full(tmp_path, tmp_path / "out.pt")
    (tmp_path / "x.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"x\.pt.*not a sharded checkpoint \(a file\)"):
        convert_sharded_to_full(tmp_path / "x.pt", tmp_path / "out.pt")
    unsafe_dcp(tmp_path / "ok")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        convert_sharded_to_full(tmp_path / "ok", tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["ok", "x.pt"]


def test_converter_command_reports_errors(tmp_path: Path) -> None:
    cli = subprocess.run(
        [sys.executable, "-m", "reference_impl.convert", str(tmp_path), str(tmp_path / "o.pt")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli.returncode == 1
    assert "error:" in cli.stderr and "not a sharded checkpoint" in cli.stderr
    assert not (tmp_path / "o.pt").exists()


def test_dcp_entries_and_metadata_need_no_arbitrary_unpickling(tmp_path: Path) -> None:
    """DCP itself unpickles freely; the reference reads its files with allow-lists."""
    unsafe_dcp(tmp_path / "entry")
    with pytest.raises(RuntimeError, match=r"'optimizer\.param_groups\.0\.evil'.*arbitrary"):
        convert_sharded_to_full(tmp_path / "entry", tmp_path / "out.pt")
    shutil.copytree(tmp_path / "entry", tmp_path / "meta")
    with open(tmp_path / "meta" / ".metadata", "wb") as f:
        pickle.dump(Opaque(), f)
    with pytest.raises(pickle.UnpicklingError, match=r"Opaque.*arbitrary unpickling"):
        SafeReader(tmp_path / "meta").read_metadata()
    with pytest.raises(pickle.UnpicklingError, match="arbitrary unpickling"):
        convert_sharded_to_full(tmp_path / "meta", tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


def test_bare_plain_module_needs_no_process_group(tmp_path: Path) -> None:
    """A plain module loads from its own state dict file; unsafe files are refused."""
    torch.manual_seed(0)
    source, model = nn.Linear(3, 2), nn.Linear(3, 2)
    torch.save(source.state_dict(), tmp_path / "sd.pt")
    assert load_checkpoint(tmp_path / "sd.pt", model, strict=True) == {}
    assert torch.equal(model.weight, source.weight)
    torch.save({"weight": Opaque()}, tmp_path / "evil.pt")
    with pytest.raises(pickle.UnpicklingError, match=r"evil\.pt.*arbitrary unpickling"):
        load_checkpoint(tmp_path / "evil.pt", model, strict=True)
    with pytest.raises(ValueError, match=r"bare module .*directory"):
        load_checkpoint(tmp_path, model, strict=True)
