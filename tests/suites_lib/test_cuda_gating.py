"""The CUDA-only checks' gate (``suites/lib/controller/cuda_env.py``): the ``environment:``
reason, or None."""

from __future__ import annotations

import pytest

from suites.lib.controller import cuda_env
from suites.lib.controller.cuda_env import cuda_skip_reason


@pytest.mark.parametrize(
    ("gpus", "backend", "world_size", "nproc"),
    [(2, "nccl", 2, None), (4, "nccl", 2, 4), (4, "nccl", 4, 4), (8, "nccl", 3, None)],
)
def test_enough_gpus_with_nccl_is_runnable(
    gpus: int, backend: str, world_size: int, nproc: int | None
) -> None:
    assert cuda_skip_reason(gpus, backend, world_size, nproc) is None


def test_no_gpu_names_what_is_missing_and_what_is_there() -> None:
    reason = cuda_skip_reason(0, "gloo", 2)
    assert reason == (
        "environment: needs CUDA with 2 GPU(s) (one per rank) and the nccl backend; this "
        "machine has 0 GPU(s), backend gloo; run on a machine with at least 2 GPU(s)"
    )


@pytest.mark.parametrize(("gpus", "world_size"), [(0, 4), (1, 2), (3, 4)])
def test_too_few_gpus(gpus: int, world_size: int) -> None:
    reason = cuda_skip_reason(gpus, "nccl", world_size)
    assert reason is not None and reason.startswith("environment: ")
    assert f"needs CUDA with {world_size} GPU(s) (one per rank)" in reason
    assert f"this machine has {gpus} GPU(s), backend nccl" in reason
    assert f"at least {world_size} GPU(s)" in reason


def test_enough_gpus_but_gloo_asks_for_nccl() -> None:
    reason = cuda_skip_reason(4, "gloo", 2)
    assert reason is not None and reason.startswith("environment: ")
    assert "this machine has 4 GPU(s), backend gloo" in reason
    assert "--backend nccl" in reason


def test_world_larger_than_nproc() -> None:
    reason = cuda_skip_reason(8, "nccl", 4, nproc=2)
    assert reason == (
        "environment: needs CUDA with 4 GPU(s) (one per rank) but --nproc is 2; "
        "run with --nproc 4 or more"
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"gpus": -1}, ValueError, r"gpus=-1 must be at least 0"),
        ({"world_size": 0}, ValueError, r"world_size=0 must be at least 1"),
        ({"nproc": 0}, ValueError, r"nproc=0 must be at least 1"),
        ({"gpus": "2"}, TypeError, r"gpus='2' must be an int"),
        ({"world_size": True}, TypeError, r"world_size=True must be an int"),
    ],
)
def test_bad_counts_are_refused(kwargs: dict, error: type[Exception], match: str) -> None:
    args = {"gpus": 2, "backend": "nccl", "world_size": 2, "nproc": None, **kwargs}
    with pytest.raises(error, match=match):
        cuda_skip_reason(**args)


def test_this_session_reason_matches_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without CUDA the session helper gives the reason, with the backend ``auto`` resolves to."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    reason = cuda_env.session_cuda_skip_reason(2)
    assert reason is not None and reason.startswith("environment: needs CUDA with 2 GPU(s)")
    assert "this machine has 0 GPU(s), backend gloo" in reason
    assert cuda_env.cuda_world_max() == cuda_env.MIN_WORLD


def test_session_with_gpus_uses_the_largest_gpu_world(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_env, "gpu_count", lambda: 3)
    monkeypatch.setattr(cuda_env, "_session_backend", lambda world: "nccl")
    monkeypatch.setattr("harness.max_world_size", lambda: 4)
    assert cuda_env.session_cuda_skip_reason(2) is None
    assert cuda_env.session_cuda_skip_reason(4) is not None
    assert cuda_env.cuda_world_max() == 3


def test_one_gpu_runs_the_checks_at_world_size_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_env, "gpu_count", lambda: 1)
    backends = {1: "nccl"}  # auto: NCCL only where every rank has a GPU
    monkeypatch.setattr(cuda_env, "_session_backend", lambda world: backends.get(world, "gloo"))
    monkeypatch.setattr("harness.max_world_size", lambda: 4)
    assert cuda_env.session_cuda_skip_reason() is None
    assert cuda_env.cuda_world_max() == 1
    reason = cuda_env.session_cuda_skip_reason(2)
    assert reason is not None and "needs CUDA with 2 GPU(s)" in reason
