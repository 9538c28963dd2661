"""CommMeter (suites/lib/ranks/cost_meters.py) files each collective by phase and tells the
ones that carry state (floating-point tensors) from metadata (byte tensors), as COMM-4 and
COMM-5 read them. Run in a child process: it forms a process group of one rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, os, sys, tempfile
import torch
import torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from suites.lib.ranks.cost_meters import CommMeter
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
meter = CommMeter()
with meter:
    with meter.phase("save"):
        out = torch.empty(4)
        dist.all_gather_into_tensor(out, torch.ones(4))
        dist.broadcast(torch.zeros(10, dtype=torch.uint8), 0)
    with meter.phase("load"):
        dist.all_reduce(torch.ones(3, dtype=torch.int64))
print(json.dumps({"all": meter.summary(), "state": meter.summary(state_only=True)}))
dist.destroy_process_group()
"""


def test_the_meter_files_collectives_by_phase_and_tells_state_from_metadata() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["all"] == {
        "save": {"all_gather": [16], "broadcast": [10]},
        "load": {"all_reduce": [24]},
    }
    assert seen["state"] == {"save": {"all_gather": [16]}}
