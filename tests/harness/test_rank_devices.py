"""A rank owns only its device: gloo ranks see no GPU, and a rank that fails while the pool
starts ends the start in seconds with its own error (checked without a GPU; the real GPU
run is ci/gpu_smoke.sh)."""

from __future__ import annotations

import os
import tempfile
import textwrap
import time
from dataclasses import replace
from typing import Any

import pytest
import torch

from harness import RankContext, run_on_ranks
from harness.pool.rankpool import PoolStartError, RankPool
from harness.pool.transport import PoolSettings
from harness.pool.transports import pipes
from harness.rank import runner
from harness.rank.worker import WorkerSpec

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def devices_seen(ctx: RankContext) -> dict[str, Any]:
    return {
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_available": torch.cuda.is_available(),
        "device": str(ctx.device),
    }


def test_gloo_ranks_see_no_gpu() -> None:
    for rank, seen in enumerate(run_on_ranks(devices_seen, world_size=2)):
        assert seen == {"CUDA_VISIBLE_DEVICES": "", "cuda_available": False, "device": "cpu"}, (
            f"rank {rank}"
        )


def test_hide_cuda_hides_a_visible_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    visible = lambda: os.environ["CUDA_VISIBLE_DEVICES"] != ""  # noqa: E731
    monkeypatch.setattr(torch.cuda, "is_available", visible)
    assert runner.rank_device("gloo", 1) == torch.device("cpu")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_hide_cuda_refuses_when_cuda_is_initialized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match=r"gloo rank must see no GPU, but CUDA was initialized"):
        runner.hide_cuda()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def test_ranks_started_with_a_visible_gpu_do_not_see_it(pytester: pytest.Pytester) -> None:
    """A session started where CUDA_VISIBLE_DEVICES names a GPU (a one-GPU machine): its
    gloo ranks have the variable emptied before torch initializes CUDA."""
    pytester.makepyfile(
        test_seen=textwrap.dedent(
            """
            import os
            from harness import run_on_ranks

            def seen(ctx):
                return os.environ.get("CUDA_VISIBLE_DEVICES")

            def test_seen():
                assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"  # the controller's
                assert run_on_ranks(seen, world_size=2) == ["", ""]
            """
        )
    )
    env = {"PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {**env, "CUDA_VISIBLE_DEVICES": "0"}.items():
            mp.setenv(key, value)
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "--nproc", "2", "--backend", "gloo", timeout=180
        )
    result.assert_outcomes(passed=1)


class _RankOneOnNccl(pipes.PipeTransport):
    """Rank 1 asks for a CUDA device this machine does not have, the others start as usual
    (what a gloo rank met on a one-GPU machine before ranks hid their GPUs)."""

    def _spawn(self, context: Any, spec: WorkerSpec) -> None:
        super()._spawn(context, replace(spec, backend="nccl") if spec.rank == 1 else spec)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA devices")
def test_a_rank_failing_at_start_ends_the_start_in_seconds() -> None:
    settings = PoolSettings(world_size=2, start_timeout=120.0, failure_grace=3.0)
    with tempfile.TemporaryDirectory() as root:
        pool = RankPool(settings, _RankOneOnNccl(root, 2))
        began = time.monotonic()
        with pytest.raises(PoolStartError) as info:
            pool.start()
        took = time.monotonic() - began
        pool.kill()
    assert took < 10.0, f"the start took {took:.1f} s"
    story = str(info.value)
    assert "forming process group 1 of 2 local ranks failed" in story
    assert "rank 1 raised" in story  # the rank's own error is the verdict
    assert "rank 0" in story and "after rank 1 raised" in story  # rank 0 was not waited out


def test_auto_runs_nccl_where_the_gpus_cover_the_world_and_gloo_above(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from harness import config

    monkeypatch.setattr(config, "gpu_count", lambda: 1)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert [config.resolve_backend("auto", n) for n in (1, 2, 4)] == ["nccl", "gloo", "gloo"]
    assert config.describe_backends("auto", [1, 2, 3, 4]) == (
        "nccl at world size 1, gloo at world size 2-4 (gloo ranks see no GPU)"
    )
    assert config.describe_backends("gloo", [1, 2, 3, 4]) == "gloo"
    monkeypatch.setattr(config, "gpu_count", lambda: 0)
    assert config.describe_backends("auto", [1, 2, 4]) == "gloo"
