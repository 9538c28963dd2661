"""FSDP1's full state read through rank 0 with FSDP1's own API, for shards on CPU.

[Note: FSDP1's full read through rank 0 on CPU]
torch's ``StateDictOptions`` ties FSDP1's ``rank0_only`` to ``cpu_offload``, and the offload
segfaults when the shards already live on CPU (see [Note: cpu_offload only for accelerator
shards] in :mod:`reference_impl.checkpoint.state`). Without it every rank would gather the
whole state, which is what a full save must not do (CONTRACT.md MEM-3). FSDP1's own
``FullStateDictConfig(offload_to_cpu=False, rank0_only=True)`` (and the optimizer's
``FullOptimStateDictConfig``) does what is wanted on CPU: every rank gathers one unit (one
parameter's optimizer state) at a time, and only rank 0 keeps it; the other ranks get empty
dicts. The keys are the same as torch's family-agnostic reader gives (FSDP1 drops its own
wrapper segments; :func:`~reference_impl.checkpoint.state.clean_name` drops the rest).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn
from torch.distributed.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    StateDictType,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.optim import Optimizer

__all__ = ["read_full_model", "read_full_optimizer"]


@contextmanager
def _through_rank0(module: nn.Module) -> Iterator[None]:
    with FSDP.state_dict_type(
        module,
        StateDictType.FULL_STATE_DICT,
        FullStateDictConfig(offload_to_cpu=False, rank0_only=True),
        FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True),
    ):
        yield


def read_full_model(module: nn.Module, clean: Any) -> dict[str, Any]:
    """The gathered model state dict on rank 0, ``{}`` elsewhere (a collective)."""
    with _through_rank0(module):
        state = module.state_dict()
    return {clean(name): value for name, value in state.items()}


def read_full_optimizer(module: nn.Module, optimizer: Optimizer, clean: Any) -> dict[str, Any]:
    """The gathered optimizer state dict keyed by parameter names on rank 0, ``{}`` elsewhere
    (a collective)."""
    with _through_rank0(module):
        osd = FSDP.optim_state_dict(module, optimizer)
    if not osd:
        return {}
    return {
        **osd,
        "state": {clean(name): value for name, value in osd.get("state", {}).items()},
        "param_groups": [
            {**group, "params": [clean(name) for name in group["params"]]}
            for group in osd.get("param_groups", [])
        ],
    }
