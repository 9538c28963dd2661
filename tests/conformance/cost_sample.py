"""A small report with a cost section, shaped like what ``suites/test_cost.py`` hands the
session (bytes of a real ``--nproc 4`` run, rounded): three families at world sizes 1 to 4,
two of them on the same points (``model_parallel`` at ``dp N x tp 1`` lays the model out as
``fsdp2`` does), plus one configuration off the series. No ranks run."""

from __future__ import annotations

from typing import Any

from harness.report import CheckResult, Report
from harness.report.cost import cost_of

PARAMS = 141_472  # the plain model's parameters, float32
PLAIN = {"params": PARAMS, "buffers": 0, "grads": PARAMS, "optimizer": 2 * PARAMS + 208,
         "activations": 4868}  # fmt: skip


def _rank(rank: int, world: int, family: str, extra: int) -> dict[str, Any]:
    params, optimizer = PARAMS // world, (2 * PARAMS + 208) // world + extra
    rest = dict.fromkeys(("grads", "buffers", "activations", "temporaries", "other"), 0)
    rest.update(params=params, optimizer=optimizer, total=params + optimizer)
    peak = dict(rest, grads=PARAMS, activations=22_508, temporaries=35_616)
    peak["total"] = sum(v for k, v in peak.items() if k != "total")
    step = {} if world == 1 else {"all_gather": [16_333] * 17, "reduce_scatter": [15_719] * 9}
    if world == 1 and family == "fsdp":
        step = {"all_reduce": [15_719] * 9}
    return {
        "rank": rank, "plain": dict(PLAIN),
        "rest": {"after setup": dict(rest, optimizer=0), "after the step": rest},
        "peak": peak, "comm": {"step": step, "clip": {"all_reduce": [4]}},
        "save_peak": {} if family == "fsdp" else dict(rest, total=rest["total"] + 116),
        "save_comm": {},
    }  # fmt: skip


def measurements() -> list[dict[str, Any]]:
    """What the cost checks would hand the session: one entry per configuration."""
    names = {
        "fsdp": "fsdp FULL_SHARD, 32-true, world {w}",
        "fsdp2": "fsdp2 reshard_after_forward=True, 32-true, world {w}",
        "model_parallel": "model_parallel dp {w} x tp 1, 32-true, world {w}",
    }
    out = [
        {"configuration": name.format(w=w), "family": family, "world_size": w,
         "ranks": [_rank(r, w, family, 0 if family == "fsdp" else 54) for r in range(w)]}
        for family, name in names.items()
        for w in (1, 2, 3, 4)
    ]  # fmt: skip
    out.append(
        {"configuration": "fsdp NO_SHARD, 32-true, world 2", "family": "fsdp", "world_size": 2,
         "ranks": [_rank(r, 1, "fsdp", 0) for r in range(2)]}
    )  # fmt: skip
    return out


def cost_report() -> Report:
    """A passing report whose ``cost`` is :func:`harness.report.cost.cost_of` of
    :func:`measurements`."""
    checks = [CheckResult("test_cost.test_memory_at_rest[fsdp]", ["MEM-1"], "passed",
                          family="fsdp")]  # fmt: skip
    return Report(
        "0.1.0",
        {"torch": "2.13.0", "python": "3.11.7", "backend": "gloo", "device": "cpu",
         "world_sizes": [1, 2, 3, 4]},
        {"factory": "reference_impl:make_strategy", "options": {}},
        checks, cost=cost_of(measurements()),
    )  # fmt: skip
