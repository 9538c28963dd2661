"""``--strategy harness.adapters.lightning:make_strategy`` through the whole plugin stack.

A small suite runs in a pytest subprocess with the pool plugin, on real ranks: Lightning's
ModelParallelStrategy sets up and steps, its FSDPStrategy is reported ``unsupported`` on CPU
(not a crash), and the report records both under the adapter's name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import harness

pytest.importorskip(
    "lightning",
    reason="environment: lightning is not installed (pip install 'shardcheck[lightning]')",
)

SUITE = """
import pytest
import torch
from torch import nn
from harness import run_on_ranks


def data_parallel(module, mesh):
    from torch.distributed.fsdp import fully_shard

    fully_shard(module, mesh=mesh["data_parallel"])
    return module


def model_parallel_job(ctx):
    strategy = ctx.make_strategy(
        "model_parallel",
        parallelize_fn=data_parallel,
        data_parallel_size=ctx.world_size,
        tensor_parallel_size=1,
    )
    strategy.setup_environment()
    model = strategy.setup_module(nn.Linear(4, 4))
    opt = strategy.setup_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    strategy.backward(model(torch.ones(2, 4)).sum(), model)
    strategy.optimizer_step(opt)
    return type(strategy).__name__


def fsdp_job(ctx):
    strategy = ctx.make_strategy("fsdp", sharding_strategy="FULL_SHARD")
    strategy.setup_environment()


@pytest.mark.clause("API-2")
@pytest.mark.world_size(2)
def test_model_parallel_steps(world_size):
    assert run_on_ranks(model_parallel_job, world_size=world_size) == [
        "ModelParallelStrategy"
    ] * world_size


@pytest.mark.clause("API-1")
@pytest.mark.world_size(2)
def test_fsdp_sets_up(world_size):
    run_on_ranks(fsdp_job, world_size=world_size)
"""


#: Load both plugins by module name whether or not their entry points are installed (blocking
#: the entry-point names avoids registering a module twice).
PLUGIN_ARGS = ["-p", "no:shardcheck", "-p", "harness.plugin"]
PLUGIN_ARGS += ["-p", "no:shardcheck_conformance", "-p", "harness.conformance"]


@pytest.mark.timeout(420)
def test_lightning_strategies_end_to_end(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(Path(harness.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_lightning_suite=SUITE)
    out = pytester.path / "out"
    result = pytester.runpytest_subprocess(
        *PLUGIN_ARGS,
        "-p",
        "no:cacheprovider",
        "--nproc",
        "2",
        "--strategy",
        "harness.adapters.lightning:make_strategy",
        "--conformance-strict",
        "--require-whole-space",
        "--conformance-report",
        str(out),
        timeout=300,
    )
    report = json.loads((out / "report.json").read_text())
    outcomes = {c["id"]: c for c in report["checks"]}
    passed = outcomes["test_lightning_suite.test_model_parallel_steps[ws2]"]
    refused = outcomes["test_lightning_suite.test_fsdp_sets_up[ws2]"]
    assert passed["outcome"] == "passed", passed["failure"]
    assert refused["outcome"] == "unsupported"
    assert refused["failure"].startswith("unsupported: device=cpu (Lightning ")
    assert "--strategy harness.adapters.lightning:make_strategy" in refused["reproducer"]
    assert report["strategy"] == {
        "factory": "harness.adapters.lightning:make_strategy",
        "options": {},
    }
    assert report["environment"]["world_sizes"] == [2]
    assert report["environment"]["backend"] == "gloo"
    # strict with the whole space required: an unsupported check fails (without
    # --require-whole-space a strategy that offers part of the space passes)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*API-1 * unsupported * test_lightning_suite.test_fsdp_sets_up*"])
