"""Regression: a frozen NO_SHARD unit keeps its parameters after a training step.

See [Note: frozen NO_SHARD units] in reference_impl/fsdp.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from harness import RankContext, run_on_ranks


class _FrozenRoot(nn.Module):
    """The root unit owns only a frozen embedding; the Linear layers are their own units."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(3, 3)
        self.embed.weight.requires_grad_(False)
        self.block = nn.Linear(3, 3)
        self.head = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(x)))


def _train_then_read(ctx: RankContext, sharding: str) -> tuple[list[str], list[str]]:
    strategy = ctx.make_strategy("fsdp", sharding_strategy=sharding, auto_wrap_policy={nn.Linear})
    strategy.setup_environment()
    model = strategy.setup_module(_FrozenRoot())
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = strategy.setup_optimizer(torch.optim.SGD(trainable, lr=0.1))
    loss = model(torch.tensor([0, 1, 2])).sum()
    strategy.backward(loss, model)
    strategy.optimizer_step(optimizer)
    names = sorted(n.replace("_fsdp_wrapped_module.", "") for n, _ in model.named_parameters())
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    strategy.teardown()
    return names, sorted(state)


@pytest.mark.parametrize("sharding", ["NO_SHARD", "FULL_SHARD"])
def test_frozen_unit_keeps_its_parameters_after_a_step(sharding: str) -> None:
    expected = ["block.bias", "block.weight", "embed.weight", "head.bias", "head.weight"]
    results = run_on_ranks(_train_then_read, sharding, world_size=2)
    for rank, (names, state_keys) in enumerate(results):
        assert names == expected, f"rank {rank}: named_parameters() lost a frozen parameter"
        assert state_keys == expected, f"rank {rank}: full state dict keys differ"
