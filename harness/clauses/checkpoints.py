"""Contract sections 5-6: checkpoints, and what only the model_parallel family must do."""

from __future__ import annotations

from harness.clauses.registry import Clause, Section

__all__ = ["CHECKPOINTS", "MODEL_PARALLEL", "MOMENTS"]

#: When a save comes (the coverage's ``moment`` axis, as the suites report it): after an
#: optimizer step, before the first one (the optimizer has no state), a second save of the
#: same objects after more training, between the micro-batches of an accumulated step; and
#: one moment of a load: into objects whose optimizer never stepped while their parameters
#: hold gradients. The clauses that speak of every moment name the axis in their scope, so
#: that the per-clause coverage lists a moment their checks never reached.
MOMENTS = (
    "after a step",
    "before first step",
    "second save",
    "mid-accumulation",
    "load with gradients held",
)

_FORMATS = (
    "Two formats. **full**: one file that rank 0 writes with `torch.save`, holding the gathered "
    "model state dict under the model's key, the gathered state dict of each optimizer under "
    "its key, and the caller's other entries. **sharded**: a directory written by "
    "`torch.distributed.checkpoint`, plus a `meta.pt` file from rank 0 with the caller's other "
    "entries. `save_checkpoint` returns on no rank before the checkpoint is complete on disk "
    "(a rank that loads right after its own save reads what was saved), and an error or a "
    "refusal in a save or a load is raised on every rank."
)

CHECKPOINTS = Section(
    5,
    "Checkpoints",
    (
        Clause(
            "CKPT-SAVE-1",
            "`save_checkpoint(path, state)` needs exactly one sharded module among the values "
            'of `state`: with none it raises `ValueError` ("could not find"), with two or more '
            '`ValueError` ("multiple"). Passing `storage_options` other than `None` raises '
            "`TypeError`.",
            scope=(("storage_options", ("None", "given")),),
        ),
        Clause(
            "CKPT-SAVE-2",
            "Rank 0's path is the one used (broadcast to the others): ranks passing different "
            "paths still produce a single checkpoint.",
        ),
        Clause(
            "CKPT-SAVE-3",
            "A full save replaces a sharded checkpoint directory found at the path, and raises "
            "`IsADirectoryError` for a directory that is not a checkpoint, leaving it as it "
            "was. A sharded save replaces a file found at the path with its directory.",
        ),
        Clause(
            "CKPT-SAVE-4",
            "Values of `state` that are neither the module nor an optimizer are metadata; an "
            "object with `state_dict()` and `load_state_dict()` is saved and restored through "
            "those methods. A learning-rate scheduler is such an object: after a load it "
            "holds the saved `state_dict()` and `get_last_lr()`, so a resumed run goes on "
            "along the saved learning-rate curve instead of restarting its warmup.",
        ),
        Clause(
            "CKPT-SAVE-5",
            "`filter={key: fn(name, value) -> bool}` keeps only the chosen entries of that key "
            "in a full checkpoint, and `filter=None` (the default) keeps every entry; a filter "
            "on a sharded save raises `NotImplementedError`.",
            scope=(("filter", ("None", "given")),),
        ),
        Clause(
            "CKPT-LOAD-1",
            "`load_checkpoint(path, state)` raises `ValueError` for an empty `state` and "
            "`NotImplementedError` for a bare optimizer. Given a bare module it loads that "
            "module from a file holding its own state dict (what `torch.save(model.state_dict(), "
            "path)` writes); a directory there raises `ValueError`. A path that is neither a "
            "file nor a sharded checkpoint raises `ValueError` naming it. Errors from "
            "`torch.distributed.checkpoint` (its `CheckpointException` is not an `Exception`) "
            "reach the caller as `RuntimeError`.",
        ),
        Clause(
            "CKPT-LOAD-2",
            "Metadata keys present in `state` are restored into it in place; the metadata "
            "nobody asked for is the return value.",
        ),
        Clause(
            "CKPT-RT-1",
            "Full save then full load at the same world size: model state, optimizer state and "
            "metadata equal what was saved, whenever the save comes: before the first "
            "optimizer step (an optimizer without state is saved and loads without state, as "
            "the plain optimizer's `state_dict()` has none, and the first step from there is a "
            "first step), after more training that followed a save of the same objects (the "
            "load equals the later save), or between the micro-batches of an accumulated step "
            "(the state before that step; the step then goes on as without the save). A load "
            "into objects whose optimizer never stepped while their parameters hold gradients "
            "(a recipe that ran a forward and a backward, then resumed) leaves the model and "
            "the optimizer state as saved (the optimizer holds the checkpoint's state, the "
            "held gradients move no parameter), and once those gradients are dropped the next "
            "step is the plain model's.",
            scope=(("checkpoint", ("full",)), ("moment", MOMENTS)),
        ),
        Clause(
            "CKPT-RT-2",
            "Sharded save then sharded load at the same world size: the same equalities, at "
            "the same moments.",
            scope=(("checkpoint", ("sharded",)), ("moment", MOMENTS)),
        ),
        Clause(
            "CKPT-RT-3",
            "Resharding: in either format, a checkpoint saved at world size A loads at world "
            "size B, and the gathered state is equal.",
        ),
        Clause(
            "CKPT-RT-4",
            "Conversion: a sharded checkpoint turned into a full one offline (no process group) "
            "loads and equals the sharded one; a full checkpoint loaded and then saved sharded "
            "equals it as well.",
        ),
        Clause(
            "CKPT-RT-5",
            "Resume: k steps, a save, a load into new objects and m more steps end where k + m "
            "uninterrupted steps end, within the precision's tolerance, for every format, "
            "sharding strategy and optimizer.",
        ),
        Clause(
            "CKPT-REKEY-1",
            "A full checkpoint whose optimizer state is keyed by integer parameter ids (as a "
            "plain torch optimizer, or a trainer's standard format, saves it) loads into the "
            "sharded model: ids follow the order of `param_groups`, several groups included, "
            "and each state lands on its own parameter.",
            scope=(("checkpoint", ("full",)),),  # it speaks of full checkpoints only
        ),
        Clause(
            "CKPT-REKEY-2",
            "The model part of a full checkpoint from the strategy loads into the plain "
            "unsharded model with torch's `load_state_dict` (no wrapper prefixes in the keys); "
            "its optimizer part is keyed by parameter name and a documented helper turns it "
            "into the plain optimizer's integer-keyed form.",
            scope=(("checkpoint", ("full",)),),  # it speaks of full checkpoints only
        ),
        Clause(
            "CKPT-TRAINER-1",
            "A full save whose `state` holds a *list* of optimizers writes each of them in "
            "torch's standard form (integer parameter ids 0..n-1 in `param_groups` order, as "
            "`Optimizer.state_dict()` returns), gathered: with the module under `state_dict` "
            "and the list under `optimizer_states` that one file is the trainer layout. "
            "Loading it matches optimizers by position, and a number of optimizers different "
            "from the file's raises `RuntimeError` naming both numbers.",
            scope=(
                ("checkpoint", ("full",)),  # the trainer layout is one full file
                # What two optimizers can hold: under FSDP1 each flat parameter must lie in
                # one of them (torch's FSDP.optim_state_dict raises "<name> is not in the
                # optimizer state" for an optimizer holding part of one). Without a policy
                # (one unit) or with a size threshold (units that cut across any split by
                # module) no such split exists; FSDP2 shards each parameter on its own.
                (
                    "wrap",
                    (
                        "classes",
                        "module_wrap_policy",
                        "custom_policy",
                        "callable",
                        "fully_shard root only",
                        "fully_shard Block",
                        "fully_shard NestedBlock",
                        "fully_shard AttentionBlock",
                    ),
                ),
            ),
        ),
        Clause(
            "CKPT-STRICT-1",
            "With `strict=True`, a model key missing from the checkpoint raises `KeyError` or "
            "`RuntimeError` naming it, an unexpected key raises as well, and a requested "
            "metadata key that the checkpoint lacks raises `KeyError` naming it.",
            scope=(("strict", ("True",)),),
        ),
        Clause(
            "CKPT-STRICT-2",
            "With `strict=False`, in both formats, model and metadata keys that are present "
            "load, missing ones keep their current values, unexpected ones are ignored, and "
            "nothing raises. Optimizer state still needs matching parameter groups; a mismatch "
            "raises `ValueError` naming the group.",
            scope=(("strict", ("False",)),),
        ),
        Clause(
            "CKPT-STRICT-3",
            "After a round trip the optimizer state is complete: every parameter group keeps "
            "its hyper-parameters (`lr`, `betas`, ...), frozen or never-stepped parameters do "
            "not spoil it, and tied parameters appear once.",
        ),
        Clause(
            "CKPT-BUF-1",
            "Persistent buffers survive a round trip; non-persistent buffers are neither "
            "written nor required when loading.",
        ),
        Clause(
            "CKPT-RT-6",
            "A full checkpoint written by one family loads into every other family.",
            # a full checkpoint, at a precision both families take
            scope=(("checkpoint", ("full",)), ("precision", ("32-true", "bf16-mixed"))),
        ),
        Clause(
            "CKPT-SAVE-6",
            "Saves are atomic: when a save fails part-way (a write error on a writing rank, an "
            "exception on one rank during a sharded save, a rank that dies while writing), "
            "what was at the path before (a full file or a sharded directory) is still there "
            "unchanged and loads, and nothing partial is left at the path or beside it. A "
            "failure the ranks survive is raised by `save_checkpoint` on every rank.",
        ),
        Clause(
            "CKPT-SAVE-7",
            "Saving changes nothing: after `save_checkpoint` the caller's `state` dict has the "
            "same keys holding the same objects with the same values, the module's and the "
            "optimizers' state are bitwise what they were, and training goes on exactly as it "
            "would have without the save.",
        ),
        Clause(
            "CKPT-SEC-1",
            "Loading never unpickles arbitrary objects: files are read with "
            "`torch.load(weights_only=True)`, so metadata holds only tensors, numbers, strings "
            "and containers of them (an object's `state_dict()` is stored, never the object), "
            "and a file that needs anything else is refused with an error saying why.",
        ),
    ),
    intro=_FORMATS,
)

MODEL_PARALLEL = Section(
    6,
    "Model-parallel specifics",
    (
        Clause(
            "MP-1",
            "The device mesh is created at `setup_environment` on the rank's device type and "
            "passed to `parallelize_fn`; asking for it before then raises `RuntimeError`.",
            scope=(("family", ("model_parallel",)),),
        ),
        Clause(
            "MP-2",
            "Tensor parallel plus FSDP2 trains like the plain model (TRAIN-1) for column-wise "
            "and row-wise plans.",
            scope=(("family", ("model_parallel",)),),
        ),
        Clause(
            "MP-3",
            "`save_distributed_checkpoint=True` saves the sharded format and `False` the full "
            "one; every checkpoint clause holds for both, DTensor parameters included.",
            scope=(("family", ("model_parallel",)),),
        ),
        Clause(
            "MP-4",
            "`no_backward_sync` switches gradient sync on every FSDP2 module and restores it on "
            "exit, also when the body raises.",
            scope=(("family", ("model_parallel",)),),
        ),
    ),
)
