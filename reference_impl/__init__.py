"""shardcheck's reference strategies: the example to copy and the baseline of the suites.

- :class:`FSDPStrategy`: FSDP1 (``FullyShardedDataParallel``) behind the strategy API.
- :class:`ModelParallelStrategy`: a user ``parallelize_fn`` (FSDP2 and/or tensor parallel) on a
  ``data_parallel`` x ``tensor_parallel`` device mesh.
- :class:`FSDP2Strategy`: FSDP2 (``fully_shard``) on the units of its own wrap policy, on a
  1-D mesh or a 2-D ``(replicate, shard)`` one (HSDP).
- :func:`make_strategy`: the default ``--strategy`` plug-in, building any of them from a
  :class:`harness.StrategySpec`.
- Precision plugins for ``32-true``, ``16-true``, ``bf16-true``, ``16-mixed``, ``bf16-mixed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reference_impl.base import ShardedStrategyBase
from reference_impl.factory import make_strategy
from reference_impl.fsdp import FSDPStrategy
from reference_impl.precision import (
    PRECISION_MODES,
    BF16MixedPrecision,
    BF16TruePrecision,
    FP16MixedPrecision,
    FP16TruePrecision,
    FP32Precision,
    Precision,
    resolve_precision,
)

if TYPE_CHECKING:
    from reference_impl.fsdp2 import FSDP2Strategy
    from reference_impl.model_parallel import ModelParallelStrategy

__all__ = [
    "PRECISION_MODES",
    "BF16MixedPrecision",
    "BF16TruePrecision",
    "FP16MixedPrecision",
    "FP16TruePrecision",
    "FP32Precision",
    "FSDP2Strategy",
    "FSDPStrategy",
    "ModelParallelStrategy",
    "Precision",
    "ShardedStrategyBase",
    "make_strategy",
    "resolve_precision",
]


def __getattr__(name: str) -> Any:
    # Imported lazily: these modules pull in DTensor and FSDP2.
    if name == "FSDP2Strategy":
        from reference_impl.fsdp2 import FSDP2Strategy

        return FSDP2Strategy
    if name == "ModelParallelStrategy":
        from reference_impl.model_parallel import ModelParallelStrategy

        return ModelParallelStrategy
    raise AttributeError(f"module 'reference_impl' has no attribute {name!r}")
