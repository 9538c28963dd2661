"""The README's "complete factory" example: the README shows examples/my_strategies.py
verbatim, the factory refuses what it must (fast, in this process), and the conformance
suites run against it on 4 ranks end with every check passed, unsupported or environment."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from harness import StrategySpec, Unsupported

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my_strategies.py"
MODEL_PARALLEL_EXAMPLE = ROOT / "examples" / "my_model_parallel.py"
ACCEPTED = {"passed", "unsupported", "environment"}
#: both plugins by module name, whether or not their entry points are installed
PLUGINS = ["-p", "no:shardcheck", "-p", "harness.plugin"]
PLUGINS += ["-p", "no:shardcheck_conformance", "-p", "harness.conformance"]


def _example(path: Path = EXAMPLE) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spec(**fields: Any) -> StrategySpec:
    return StrategySpec(
        **{"family": "fsdp", "rank": 0, "world_size": 2, "device": torch.device("cpu"), **fields}
    )


@pytest.mark.parametrize("example", [EXAMPLE, MODEL_PARALLEL_EXAMPLE], ids=lambda p: p.stem)
def test_the_readme_shows_the_example_file_verbatim(example: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert example.read_text() in blocks, (
        f"README.md's factory of this family must be examples/{example.name}, verbatim"
    )


def test_the_model_parallel_example_hands_over_the_suites_parallelize_fn() -> None:
    make_strategy = _example(MODEL_PARALLEL_EXAMPLE).make_strategy

    def parallelize(module: torch.nn.Module, mesh: Any) -> torch.nn.Module:
        return module

    spec = _spec(family="model_parallel", parallelize_fn=parallelize, data_parallel_size=2,
                 tensor_parallel_size=1)  # fmt: skip
    strategy = make_strategy(spec)
    assert strategy._parallelize_fn is parallelize  # handed over as it came
    with pytest.raises(ValueError, match=r"state_dict_type='full' is not an option"):  # CFG-10
        make_strategy(_spec(family="model_parallel", parallelize_fn=parallelize,
                            state_dict_type="full"))  # fmt: skip
    with pytest.raises(Unsupported, match=r"family=fsdp"):
        make_strategy(_spec())


def test_the_example_builds_fsdp_and_refuses_what_it_cannot_honour() -> None:
    make_strategy = _example().make_strategy
    assert type(make_strategy(_spec())).__name__ == "MyFSDPStrategy"
    with pytest.raises(ValueError, match=r"HYBRID_SHARD_ZERO2.*FULL_SHARD"):  # CFG-1
        make_strategy(_spec(sharding_strategy="HYBRID_SHARD_ZERO2"))
    with pytest.raises(ValueError, match=r"data_parallel_size=2 is not an option"):  # CFG-10
        make_strategy(_spec(data_parallel_size=2))
    with pytest.raises(Unsupported, match=r"sharding_strategy=hybrid_shard \(hybrid"):
        make_strategy(_spec(sharding_strategy="hybrid_shard"))
    from torch.distributed.fsdp import ShardingStrategy

    with pytest.raises(Unsupported, match=r"hybrid sharding is not implemented"):
        make_strategy(_spec(sharding_strategy=ShardingStrategy._HYBRID_SHARD_ZERO2))
    with pytest.raises(Unsupported, match=r"family=model_parallel"):
        make_strategy(_spec(family="model_parallel"))


@pytest.mark.timeout(1800)  # about 2 minutes alone on 2 cores; room for a busy machine
def test_the_suites_accept_the_readme_example(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(EXAMPLE.parent), str(ROOT), os.environ.get("PYTHONPATH", "")]
        ),
    }
    env.pop("SHARDCHECK_STRATEGY", None)
    command = [
        sys.executable, "-m", "pytest", "suites/", *PLUGINS, "-p", "no:cacheprovider", "-q",
        "--nproc", "4", "--hypothesis-profile=ci", "--strategy", "my_strategies:make_strategy",
        "--conformance-report", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=1700)
    except subprocess.TimeoutExpired:
        # SIGTERM: the run stops its ranks, removes its temporary files and writes the report,
        # whose `not run` checks the assertions below then list
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    tail = stdout[-4000:] + stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    bad = [
        f"{c['id']}: {c['outcome']}: {c['failure']}"
        for c in report["checks"]
        if c["outcome"] not in ACCEPTED
    ]
    assert bad == [], "\n".join(bad) + "\n" + tail
    assert proc.returncode == 0, tail
    assert report["strategy"]["factory"] == "my_strategies:make_strategy"
    counts = report["counts"]
    assert counts["passed"] >= 40, counts  # the fsdp checks ran: the run is not vacuous
    # by the family a check is about (a check loading into fsdp what the reference's
    # model_parallel strategy wrote is an fsdp check, and runs)
    model_parallel = [c for c in report["checks"] if c.get("family") == "model_parallel"]
    assert model_parallel and {c["outcome"] for c in model_parallel} <= {
        "unsupported",
        "environment",
    }
