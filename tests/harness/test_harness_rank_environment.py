"""What a rank's environment holds: torchrun's variables, and NCCL settings that make a hung
collective raise inside the job (checked without a GPU)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from harness import run_on_ranks
from harness.rank import worker


def test_nccl_ranks_raise_on_timeout_instead_of_tearing_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}

    def fake_init(backend: str, **kwargs: Any) -> None:
        seen.update(kwargs, backend=backend)
        seen["env"] = {
            k: os.environ.get(k)
            for k in ("TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
        }

    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # what torchrun sets
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    monkeypatch.setattr(worker.dist, "init_process_group", fake_init)
    device = torch.device("cuda", 1)
    worker.join_process_group("nccl", object(), rank=1, world_size=2, pg_timeout=9.0, device=device)
    assert seen["backend"] == "nccl" and seen["device_id"] == device
    assert seen["timeout"].total_seconds() == 9.0
    assert seen["env"] == {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


def test_gloo_ranks_leave_the_nccl_settings_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    monkeypatch.setattr(worker.dist, "init_process_group", lambda b, **kw: seen.update(kw))
    worker.join_process_group("gloo", object(), 0, 2, 5.0, torch.device("cpu"))
    assert "device_id" not in seen
    assert "TORCH_NCCL_BLOCKING_WAIT" not in os.environ


def _launcher_variables(ctx: Any) -> dict[str, str | None]:
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
    return {name: os.environ.get(name) for name in names}


def test_local_ranks_see_torchruns_variables() -> None:
    for rank, seen in enumerate(run_on_ranks(_launcher_variables, world_size=2)):
        assert seen == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0",
        }, f"rank {rank}"
