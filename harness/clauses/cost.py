"""Contract section 8: cost, what sharding is for (memory held and collectives issued)."""

from __future__ import annotations

from harness.clauses.registry import Clause, Section

__all__ = ["COST"]

COST = Section(
    8,
    "Cost: memory and communication",
    (
        Clause(
            "MEM-1",
            "At rest (after `setup_module` and `setup_optimizer`; after a step's backward, "
            "gradients held; after `optimizer_step` and `zero_grad`; after a full "
            "`load_checkpoint` of what was saved), the bytes of the distinct "
            "storages a rank's model holds as parameters and gradients, and its optimizer holds "
            "as state, are at most its share of the plain model's: the plain model's bytes of "
            "that category divided by the shard size (FSDP1's shard group: the world, the "
            "mesh's inner dim under hybrid sharding, 1 under `NO_SHARD`; fsdp2's shard dim; "
            "model_parallel's `data_parallel_size`), plus one row per tensor for the padding "
            "of uneven shards and 16 bytes per tensor for alignment.",
        ),
        Clause(
            "MEM-2",
            "During a training step (every micro-batch's forward and backward, the clip, the "
            "optimizer step) a rank's peak, everything counted, stays within its MEM-1 share "
            "plus what the configuration keeps in flight: unsharded parameters (with reshard "
            "after forward: the root unit and the two largest other units; without: every "
            "unit), unsharded gradients (with micro-batches accumulated under "
            "`no_backward_sync`: every unit; else the two largest units), three of the largest "
            "unit's bytes for collective buffers, and four times the plain model's activation "
            "peak on the same micro-batch; 5% tolerance on the sum. Where nothing is sharded "
            "FSDP1 holds no unsharded copies (it computes on the stored parameters); FSDP2 "
            "gathers into buffers of its own even then, and is allowed them.",
        ),
        Clause(
            "MEM-3",
            "A full save moves the state through rank 0: during `save_checkpoint` in the full "
            "format, no rank other than 0 holds more than its MEM-1 share plus the largest "
            "unit's full parameters and their optimizer state (where nothing is sharded, shard "
            "size 1, one copy of the parameters instead: FSDP1's `NO_SHARD` read copies them "
            "on every rank), and rank 0 holds the full state "
            "at most once (its share, the plain model's parameters and optimizer state, and one "
            "largest unit more; under FSDP1's hybrid shardings the first rank of each replica "
            "may too, as FSDP1 counts `rank0_only` within the shard group); 5% tolerance.",
        ),
        Clause(
            "MEM-4",
            "A full load holds the saved state at most once: during `load_checkpoint` of a full "
            "file, a rank holds at most twice its MEM-1 share (the shards it has and those it "
            "cuts from the file before they replace them), the file's parameters and optimizer "
            "state once (read or memory-mapped on the rank, or received from rank 0), and the "
            "largest unit's full parameters and their optimizer state (one copy of the "
            "parameters where nothing is sharded); the shares carry the padding allowance, no "
            "further tolerance. What it holds once the load "
            "returned is MEM-1's.",
        ),
        Clause(
            "COMM-1",
            "The synchronized micro-batch of a step (its forward and backward, outside "
            "`no_backward_sync`) issues the collectives its configuration implies and no more: "
            "gradients reduced once (reduce-scatters, plus all-reduces across HSDP's replicas; "
            "one all-reduce per unit under `NO_SHARD`) of at most the plain model's gradient "
            "bytes in the reduce dtype plus padding; parameters all-gathered at most twice (in "
            "forward and again in backward) and, with reshard after forward and a shard size "
            "above 1, at least twice less the root unit's, so a strategy that keeps every unit "
            "gathered is seen; tensor parallelism's own activation all-reduces are allowed "
            "beside them.",
        ),
        Clause(
            "COMM-2",
            "`clip_gradients_norm` communicates norms, not gradients: every collective it "
            "issues moves at most 16 bytes per parameter tensor (a partial norm each), whatever "
            "the model's size.",
        ),
        Clause(
            "COMM-3",
            "Inside `no_backward_sync(enabled=True)` no collective moves a gradient: the "
            "micro-batches there issue no reduce-scatter, and all-reduces only where tensor "
            "parallelism reduces activations (per micro-batch, no more bytes than the "
            "synchronized micro-batch's all-reduces).",
        ),
        Clause(
            "COMM-4",
            "A full save gathers each tensor once: during `save_checkpoint` in the full format a "
            "rank's all-gathers of state (floating-point tensors; the object gathers of "
            "metadata are not state) move at most the plain model's parameters and optimizer "
            "state (each tensor gathered once per mesh dimension it is sharded on: under tensor "
            "parallelism to its 1/tp piece, then whole), plus padding; a save that gathers the "
            "state twice, or gathers what it then discards, is seen.",
        ),
        Clause(
            "COMM-5",
            "A sharded save, and a sharded load at the world size it was saved at, move no "
            "state between ranks: each rank writes and reads its own shards, so every "
            "collective they issue carries metadata (the plans and object lists that "
            "checkpointing exchanges, pickled into byte and integer tensors), never a "
            "floating-point tensor of parameters or optimizer state.",
            scope=(("family", ("fsdp2", "model_parallel")),),
        ),
    ),
    intro=(
        "A sharded strategy exists to fit a model one device cannot hold and to scale out. "
        "These clauses hold it to the memory and communication its configuration promises. "
        "Every bound is computed from the plain model's sizes, measured on the same rank with "
        "the same instrument, and the configuration (family, sharding, reshard after forward, "
        "mesh, world size, precision), never from the reference's figures. Memory is counted "
        "with torch's `MemTracker` (bytes of distinct storages: a view and its base once, a "
        "DTensor its local shard) and collectives with torch's `CommDebugMode` (each c10d or "
        "functional collective; its bytes are its largest buffer: an all-gather's output, a "
        "reduce-scatter's input). The step measured is the second one, after lazy "
        "initialization; a torch without these instruments makes the checks `environment`."
    ),
)
