"""Checkpoint I/O shared by the reference strategies (CONTRACT.md section 5, the CKPT-* clauses).

Two formats, for FSDP1, FSDP2 and tensor-parallel (DTensor) models alike:

- **full**: one file written by rank 0 with ``torch.save``: the gathered model state dict
  (keys as in the plain model), each optimizer's gathered state keyed by parameter names,
  lists of optimizers in the standard integer-keyed form (the trainer layout), metadata;
- **sharded**: a ``torch.distributed.checkpoint`` directory plus ``meta.pt`` (metadata).

Either loads into either family at any world size; files are read with
``torch.load(weights_only=True)`` only. :func:`convert_sharded_to_full` turns a sharded
checkpoint into a full one offline (also ``python -m reference_impl.convert SRC DST``).
"""

from __future__ import annotations

from reference_impl.checkpoint.api import load_checkpoint, save_checkpoint
from reference_impl.checkpoint.convert import convert_sharded_to_full
from reference_impl.checkpoint.files import is_sharded_checkpoint
from reference_impl.checkpoint.rekey import (
    is_standard_optimizer_state,
    plain_param_names,
    to_named_optimizer_state,
    to_standard_optimizer_state,
)
from reference_impl.checkpoint.state import is_sharded_module

__all__ = [
    "convert_sharded_to_full",
    "is_sharded_checkpoint",
    "is_sharded_module",
    "is_standard_optimizer_state",
    "load_checkpoint",
    "plain_param_names",
    "save_checkpoint",
    "to_named_optimizer_state",
    "to_standard_optimizer_state",
]
