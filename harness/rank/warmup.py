"""A tiny FSDP2 training step: the ranks' warm-up and the benchmark's typical job.

Preloading modules in the forkserver removes the import cost of the first job, but torch
still pays first-use costs in every process the first time FSDP2/DTensor run (sharding
propagation, autograd and optimizer set-up): several times the step itself. Ranks run this
step once while the pool starts, so the first job of a session is not markedly slower than
the rest. It must not run in the forkserver: thread pools started there do not survive
``fork``.
"""

from __future__ import annotations

import time

import torch
from torch import nn

__all__ = ["tiny_fsdp2_step"]


def tiny_fsdp2_step(device: torch.device | None = None) -> float:
    """Two Linear layers, ``fully_shard`` on each and on the root, two AdamW steps.

    Needs the default process group. Returns the seconds it took.

    Args:
        device: where the model lives (default CPU).
    """
    from torch.distributed.fsdp import fully_shard

    start = time.perf_counter()
    device = device or torch.device("cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to(device)
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 16, device=device)
    for _ in range(2):
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return time.perf_counter() - start
