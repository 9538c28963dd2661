"""Tensor-parallel plans and ``parallelize_fn``s for the model_parallel family.

A ``parallelize_fn(module, device_mesh) -> module`` gets the strategy's 2-D mesh
(``data_parallel`` x ``tensor_parallel``), applies the tensor-parallel plan of every zoo
``Block`` on the ``tensor_parallel`` dim, then ``fully_shard`` on the ``data_parallel`` dim:
first the modules of the configured classes (post-order, so nested units come first), then
the root. It leaves the module where it is (meta or real): the strategy materializes it.
:meth:`suites.lib.shared.specs.MPConfig.parallelize_fn` binds :func:`parallelize_zoo` to a
configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from suites.lib.shared.models import Block

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "DP_DIM",
    "TP_DIM",
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


def expected_tp_placements(name: str) -> tuple[str, ...] | None:
    """The tensor-parallel placement a parameter must carry under the ``mlp`` plan.

    Returns:
        ``("Shard(0)",)`` for ``fc1.weight``/``fc1.bias``, ``("Shard(1)",)`` for
        ``fc2.weight``, ``("Replicate()",)`` for ``fc2.bias``, and None for a parameter the
        plan does not touch.
    """
    if ".fc1." in f".{name}":
        return ("Shard(dim=0)",)
    if name.endswith("fc2.weight"):
        return ("Shard(dim=1)",)
    if name.endswith("fc2.bias"):
        return ("Replicate()",)
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
        tp_plan: ``none`` or ``mlp`` (see :func:`mlp_plan`).
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
            if isinstance(sub, Block):
                parallelize_module(sub, tp_mesh, mlp_plan())
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
