"""Rank side of the sharding checks (``test_sharding.py``): each rank's FSDP1 units and
shards, and its DTensor rows under the fsdp2 family (SHARD-1), the units a wrap policy
selects and a module the user wrapped (WRAP-1; WRAP-2, fsdp2 too), and the modules activation
checkpointing wraps (AC-1).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from harness import RankContext
from suites.lib.ranks.readers import gathered_state, placements
from suites.lib.ranks.structure import (
    checkpoint_wrapped,
    fsdp1_units,
    fsdp2_units,
    nested_checkpoint_wrappers,
)
from suites.lib.ranks.training import end, setup
from suites.lib.shared.models import build_model
from suites.lib.shared.specs import Scenario

__all__ = [
    "ac_rank",
    "dtensor_layout_rank",
    "layout_rank",
    "prechecked_rank",
    "prewrapped_rank",
    "units_rank",
]


def layout_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    t = setup(ctx, scenario)
    out = {"units": fsdp1_units(t.model), "state": gathered_state(t.model)}
    end(t.strategy)
    return out


def dtensor_layout_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    """Each parameter of the set-up model as ``(placements, local shape, global shape)`` by
    clean name (no placements: not a DTensor), and the gathered state."""
    t = setup(ctx, scenario)
    out = {"params": placements(t.model), "state": gathered_state(t.model)}
    end(t.strategy)
    return out


def units_rank(ctx: Any, scenario: Scenario) -> list[str]:
    t = setup(ctx, scenario)
    units = sorted(fsdp1_units(t.model))
    end(t.strategy)
    return units


def prewrapped_rank(ctx: RankContext, scenario: Scenario) -> dict[str, Any]:
    """Set up a model whose ``blocks.0`` the user made a unit of the scenario's family
    (an FSDP1 wrapper, or ``fully_shard`` with its defaults over the world); the units after
    ``setup_module`` and its warnings."""
    strategy = ctx.make_strategy(scenario.family, **scenario.options())
    strategy.setup_environment()
    zoo = build_model(scenario.model, ctx.device)
    if scenario.family == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(zoo.blocks[0], mesh=init_device_mesh(ctx.device.type, (ctx.world_size,)))
        read_units: Callable[[nn.Module], Iterable[str]] = fsdp2_units
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        # the user's own unit, with the original parameters like the strategy's (frozen
        # ones cannot share a flat parameter with trainable ones otherwise)
        zoo.blocks[0] = FSDP(zoo.blocks[0], device_id=ctx.device, use_orig_params=True)
        read_units = fsdp1_units
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = strategy.setup_module(zoo)
    out = {"units": sorted(read_units(model)), "warnings": [str(w.message) for w in caught]}
    end(strategy)
    return out


def ac_rank(ctx: Any, scenario: Scenario) -> dict[str, list[str]]:
    t = setup(ctx, scenario)
    out = {"wrapped": checkpoint_wrapped(t.model), "nested": nested_checkpoint_wrappers(t.model)}
    end(t.strategy)
    return out


def prechecked_rank(ctx: RankContext, scenario: Scenario) -> dict[str, Any]:
    from harness.torch_compat import checkpoint_wrapper

    strategy = ctx.make_strategy(scenario.family, **scenario.options())
    strategy.setup_environment()
    zoo = build_model(scenario.model, ctx.device)
    zoo.blocks[0] = checkpoint_wrapper(zoo.blocks[0])  # the user's own checkpointing
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = strategy.setup_module(zoo)
    out = {
        "wrapped": checkpoint_wrapped(model),
        "nested": nested_checkpoint_wrappers(model),
        "warnings": [str(w.message) for w in caught],
    }
    end(strategy)
    return out
