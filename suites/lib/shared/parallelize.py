"""Tensor-parallel plans and ``parallelize_fn``s for the model_parallel family.

A ``parallelize_fn(module, device_mesh) -> module`` gets the strategy's 2-D mesh
(``data_parallel`` x ``tensor_parallel``), applies the tensor-parallel plan of every zoo
``Block`` and ``AttentionBlock`` on the ``tensor_parallel`` dim (:func:`block_plan`), then
``fully_shard`` on the ``data_parallel`` dim: first the modules of the configured classes
(post-order, so nested units come first), then the root. It leaves the module where it is
(meta or real): the strategy materializes it.
:meth:`suites.lib.shared.specs.MPConfig.parallelize_fn` binds :func:`parallelize_zoo` to a
configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from suites.lib.shared.models import AttentionBlock, Block, HandAttention

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "DP_DIM",
    "TP_DIM",
    "block_plan",
    "expected_tp_placements",
    "mlp_plan",
    "parallelize_zoo",
]

DP_DIM = "data_parallel"
TP_DIM = "tensor_parallel"


def mlp_plan() -> dict[str, Any]:
    """The Megatron MLP plan of a zoo ``Block``: ``fc1`` column-wise, ``fc2`` row-wise.

    The Block's input and output stay replicated over the tensor-parallel dim; ``fc1``'s
    output is sharded on its last dim, which the element-wise GELU keeps, and ``fc2``
    reduces the partial sums.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def block_plan(block: nn.Module) -> dict[str, Any]:
    """The tensor-parallel plan of one zoo block (``Block`` or ``AttentionBlock``).

    The MLP gets :func:`mlp_plan`. Hand-written attention gets the Megatron attention
    plan: ``wq``/``wk``/``wv`` column-wise (each rank computes whole heads: the head count
    divides by the tensor-parallel size, which the scenarios draw) and ``wo`` row-wise, so
    the attention's input and output stay replicated like the MLP's.

    [Note: no tensor parallel inside nn.MultiheadAttention] ``nn.MultiheadAttention`` keeps
    q/k/v in one ``in_proj_weight`` and reads its own ``embed_dim``/``num_heads`` for every
    reshape, so a column-wise split of its projection cannot give each rank whole heads
    without replacing the module; its parameters (and its ``proj_in``/``proj_out``) stay
    out of the plan and are sharded by FSDP2 on the data-parallel dim only.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = mlp_plan()
    if isinstance(block, AttentionBlock) and isinstance(block.attn, HandAttention):
        plan.update({f"attn.{p}": ColwiseParallel() for p in ("wq", "wk", "wv")})
        plan["attn.wo"] = RowwiseParallel()
    return plan


_COLUMN = (".fc1.", ".attn.wq.", ".attn.wk.", ".attn.wv.")
_ROW = (".fc2.", ".attn.wo.")


def expected_tp_placements(name: str) -> tuple[str, ...] | None:
    """The tensor-parallel placement a parameter must carry under the ``mlp`` plan.

    Returns:
        ``("Shard(0)",)`` for the column-wise ``fc1`` and ``attn.wq``/``wk``/``wv``
        weights and biases, ``("Shard(1)",)`` for the row-wise ``fc2``/``attn.wo``
        weights, ``("Replicate()",)`` for their biases, and None for a parameter the plan
        does not touch.
    """
    dotted = f".{name}"
    if any(part in dotted for part in _COLUMN):
        return ("Shard(dim=0)",)
    if any(part in dotted for part in _ROW):
        return ("Shard(dim=1)",) if name.endswith("weight") else ("Replicate()",)
    return None


def _mp_policy(precision: str) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    if precision == "16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float16)
    return MixedPrecisionPolicy()


def parallelize_zoo(
    module: nn.Module,
    device_mesh: DeviceMesh,
    *,
    tp_plan: str = "none",
    fsdp_classes: tuple[str, ...] = ("Block",),
    reshard_after_forward: bool = True,
    precision: str = "32-true",
) -> nn.Module:
    """Apply the tensor-parallel plan, then FSDP2, to a zoo model.

    Args:
        module: the zoo model (any device, meta included).
        device_mesh: the strategy's 2-D mesh with dims ``data_parallel``/``tensor_parallel``.
        tp_plan: ``none`` or ``mlp`` (every block's plan, attention included: see
            :func:`block_plan`).
        fsdp_classes: zoo class names that become their own FSDP2 unit.
        reshard_after_forward: passed to ``fully_shard``.
        precision: a mixed precision applies the matching ``MixedPrecisionPolicy``.
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    if tp_plan not in ("none", "mlp"):
        raise ValueError(f"tp_plan={tp_plan!r} is unknown; use 'none' or 'mlp'.")
    if tp_plan == "mlp":
        tp_mesh = device_mesh[TP_DIM]
        for sub in module.modules():
            if isinstance(sub, (Block, AttentionBlock)):
                parallelize_module(sub, tp_mesh, block_plan(sub))
    dp_mesh = device_mesh[DP_DIM]
    kwargs = {
        "mesh": dp_mesh,
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": _mp_policy(precision),
    }
    units = [m for m in module.modules() if type(m).__name__ in fsdp_classes and m is not module]
    for sub in reversed(units):  # post-order: inner units before the units that hold them
        fully_shard(sub, **kwargs)
    fully_shard(module, **kwargs)
    return module
