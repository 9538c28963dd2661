"""Rank side of the model_parallel checks (``test_model_parallel.py``): the 2-D mesh and its
hand-over to ``parallelize_fn`` (MP-1), the FSDP2 and tensor-parallel placements (SHARD-1,
MP-2), and ``no_backward_sync`` switching every FSDP2 module (MP-4, SYNC-1).
"""

from __future__ import annotations

from typing import Any

from harness import RankContext
from suites.lib.ranks.readers import placements
from suites.lib.ranks.structure import fsdp2_units, sync_flags, sync_flags_after_a_raise
from suites.lib.ranks.training import end, setup
from suites.lib.shared.models import BlockSpec, ModelSpec, build_model
from suites.lib.shared.parallelize import parallelize_zoo
from suites.lib.shared.specs import Scenario

__all__ = ["layout_rank", "mesh_rank", "switch_rank"]

SPEC = ModelSpec(hidden=4, blocks=(BlockSpec(ffn=4), BlockSpec("NestedBlock", ffn=2, inner=1)))


def mesh_rank(ctx: RankContext, dp: int, tp: int) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def parallelize(module: Any, mesh: Any) -> Any:
        seen["mesh"] = mesh
        return parallelize_zoo(module, mesh, tp_plan="mlp" if tp > 1 else "none")

    strategy = ctx.make_strategy(
        "model_parallel", parallelize_fn=parallelize, data_parallel_size=dp, tensor_parallel_size=tp
    )
    out: dict[str, Any] = {"device": ctx.device.type}
    try:
        strategy.device_mesh  # noqa: B018 - reading it is the check
        out["early"] = "no error"
    except RuntimeError:
        out["early"] = "RuntimeError"
    strategy.setup_environment()
    mesh = strategy.device_mesh
    out.update(
        type=mesh.device_type, names=tuple(mesh.mesh_dim_names or ()), shape=tuple(mesh.shape)
    )
    strategy.setup_module(build_model(SPEC))
    given_mesh = seen.get("mesh")
    out["handed"] = given_mesh is not None and (
        given_mesh is mesh
        or tuple(given_mesh.mesh.flatten().tolist()) == tuple(mesh.mesh.flatten().tolist())
    )
    end(strategy)
    return out


def layout_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    t = setup(ctx, scenario)
    out = {"params": placements(t.model), "units": fsdp2_units(t.model)}
    end(t.strategy)
    return out


def switch_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    t = setup(ctx, scenario)
    out: dict[str, Any] = {"before": sync_flags(t.model)}
    with t.strategy.no_backward_sync(t.model, enabled=True):
        out["inside"] = sync_flags(t.model)
    out["after"] = sync_flags(t.model)
    out["after_raise"] = sync_flags_after_a_raise(t.strategy, t.model)
    from torch.distributed.fsdp import FSDPModule

    inner = [m for m in t.model.modules() if isinstance(m, FSDPModule) and m is not t.model]
    if inner:  # the user switched one unit off before entering: it must stay off
        inner[0].set_requires_gradient_sync(False, recurse=False)
        out["user_before"] = sync_flags(t.model)
        with t.strategy.no_backward_sync(t.model, enabled=True):
            pass
        out["user_after"] = sync_flags(t.model)
    end(t.strategy)
    return out
