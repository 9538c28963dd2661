"""Contract section 7: what the fsdp2 family adds (a strategy that calls ``fully_shard`` itself)."""

from __future__ import annotations

from harness.clauses.registry import Clause, Section
from harness.clauses.words import ClassWords

__all__ = ["FSDP2"]

_FAMILY = ("family", ("fsdp2",))

FSDP2 = Section(
    7,
    "FSDP2 specifics",
    (
        Clause(
            "FSDP2-1",
            "fsdp2 family: the `FSDPModule`s of the set-up model are exactly the modules "
            "`auto_wrap_policy` selects (each instance of a class of the set, each module a "
            "callable `fn(module)` or an FSDP1-style policy selects) and the root; no other "
            "module is one. Every parameter is a DTensor sharded along dim 0 over the mesh's "
            "shard dimension.",
            scope=(_FAMILY, ("wrap classes", ClassWords.ALL)),
        ),
        Clause(
            "FSDP2-2",
            "fsdp2 family: after a forward and before its backward, every unit's parameters "
            "are registered as `reshard_after_forward` says: with `True` as their shards "
            "(DTensors of at most ceil(dim0 / shard size) rows on a rank, that many on some "
            "rank), with `False` unsharded (plain tensors of the full shape), with an int n as "
            "DTensors resharded over n ranks (at most ceil(dim0 / n) rows, that many on some "
            "rank). Training then matches the plain model in each case (TRAIN-1). An int that "
            "does not divide the shard dimension raises `ValueError` naming it.",
            scope=(
                _FAMILY,
                (
                    "sharding",
                    ("reshard after forward", "no reshard after forward", "reshard to 2"),
                ),
            ),
        ),
        Clause(
            "FSDP2-3",
            "fsdp2 family: with `device_mesh=(replicate, shard)` (HSDP) each parameter is "
            "sharded over the shard dimension and replicated over the replicate dimension, "
            "every rank trains on its own micro-batch, and training matches the plain model "
            "(the replicas' gradients are all-reduced). Its checkpoints, in either format, load "
            "at another world size and mesh (a 1-D one included) with equal gathered state.",
            scope=(_FAMILY, ("sharding", ("hsdp",))),
        ),
        Clause(
            "FSDP2-4",
            "fsdp2 family: the precision is the units' mixed-precision policy. Under "
            "`bf16-mixed` and `16-mixed` every unit gathers its parameters for forward in the "
            "low dtype and reduces gradients in the low dtype, while the sharded parameters, "
            "their gradients and the optimizer state stay float32, and the model's output has "
            "the low dtype. Under `32-true`, `bf16-true` and `16-true` nothing is cast: "
            "parameters are gathered and gradients reduced in the stored dtype.",
            scope=(_FAMILY,),
        ),
    ),
    intro=(
        "The fsdp2 family is a strategy that applies FSDP2's `fully_shard` itself: on each "
        "module of its wrap policy (inner ones first), then on the root, with its own "
        "`reshard_after_forward`, mixed-precision policy (from the precision), offload policy "
        "and mesh: 1-D over the world, or 2-D `(replicate, shard)` for HSDP. Every other "
        "clause applies to it as to the other families, but for those that name another "
        "family only: WRAP-1 speaks of FSDP1's units, and FSDP2-1 is its fsdp2 counterpart."
    ),
)
