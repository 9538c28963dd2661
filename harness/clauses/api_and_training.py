"""Contract sections 1-4: the strategy object, construction, sharding, training."""

from __future__ import annotations

from harness.clauses.checkpoints import MOMENTS
from harness.clauses.registry import Clause, Section
from harness.clauses.words import ClassWords

__all__ = ["API", "CONSTRUCTION", "SHARDING", "TRAINING"]

#: the fsdp2 family's values on the sharding axis: every one splits each parameter over the
#: shard dimension (what ``reshard_after_forward`` changes comes after a forward; HSDP adds
#: replicas of the shards)
_FSDP2_LAYOUTS = ("reshard after forward", "no reshard after forward", "reshard to 2", "hsdp")

API = Section(
    1,
    "The strategy object (API surface)",
    (
        Clause(
            "API-1",
            "When the caller has already initialized the default process group, "
            "`setup_environment()` uses that group as it is: it neither initializes a second "
            "one nor destroys the caller's.",
        ),
        Clause(
            "API-2",
            "`setup_module(module)` gives back the sharded module. `setup_optimizer(optimizer)` "
            "gives back an optimizer whose steps update the sharded parameters; the optimizer "
            "is built from the parameters of the module after `setup_module`, and an optimizer "
            "that holds none of them is refused with `ValueError` telling the user to create "
            "it after `setup_module`. For the fsdp family with `use_orig_params=True`, "
            "`setup_module_and_optimizers(module, [optimizers])` gives back "
            "`(module, [optimizers])`.",
        ),
        Clause(
            "API-3",
            "`module_init_context(empty_init)` is a context manager. With `empty_init=True` "
            "the parameters it creates live on the meta device, and `setup_module` "
            "materializes them, calling `reset_parameters()` once on every module that directly "
            "owns parameters or buffers. With `empty_init` False or None, parameters are real "
            "tensors initialized as usual.",
            scope=(("empty_init", ("None", "True", "False")),),
        ),
        Clause(
            "API-4",
            "`backward(loss, module)` and `optimizer_step(optimizer)` go through the precision "
            "plugin (under `16-mixed` that includes the gradient scaler). The precision object "
            "offers `forward_context()` and `convert_input(x)`, and the suites run every "
            "forward and loss inside `forward_context()` on `convert_input`'s inputs. Under "
            "`16-mixed` and `bf16-mixed`, `forward_context()` autocasts to the low dtype on the "
            "rank's device type (`torch.autocast`): the forward meets float32 inputs and "
            "buffers beside parameters that a mixed-precision policy (FSDP's, or the one a "
            "`parallelize_fn` applies) casts to the low dtype, and must run all the same; "
            "`convert_input` leaves inputs float32. Under `16-true` and `bf16-true`, "
            "`convert_input` gives floating inputs the parameters' low dtype. Under `32-true` "
            "both may change nothing.",
        ),
        Clause(
            "API-5",
            '`all_reduce(tensor, group=None, reduce_op=...)` with `reduce_op` `"mean"` or '
            '`"sum"` (passed by keyword) reduces over the whole world and returns anything '
            "that is not a tensor as it came. `broadcast(obj, src)` gives every rank the "
            "picklable object of rank `src`, rank 0 or any other. `barrier()` returns on every "
            "rank.",
            scope=(("reduce_op", ("mean", "sum")), ("src", ("0", "non-zero"))),
        ),
        Clause(
            "API-6",
            "`root_device` is the device of this rank. `distributed_sampler_kwargs` holds "
            "`num_replicas` and `rank` of the data-parallel dimension: the whole world for the "
            "fsdp family, the `data_parallel` mesh dimension for the model_parallel family.",
        ),
        Clause(
            "API-7",
            "`checkpoint_io` exists only to be refused: reading it or assigning it raises "
            "`NotImplementedError`.",
        ),
        Clause(
            "API-8",
            "`teardown()` frees what the strategy holds, and a default process group created "
            "by the caller is still usable afterwards.",
        ),
    ),
)

CONSTRUCTION = Section(
    2,
    "Construction and validation",
    (
        Clause(
            "CFG-1",
            "`sharding_strategy` takes one of `FULL_SHARD`, `SHARD_GRAD_OP`, `NO_SHARD`, "
            "`HYBRID_SHARD`, `_HYBRID_SHARD_ZERO2`, as a name in any letter case or as torch's "
            "`ShardingStrategy` member. Any other value raises `ValueError` that names it and "
            "lists the accepted names, even when the strategy supports only some of them "
            "(validation comes before any `Unsupported`).",
            scope=(("family", ("fsdp",)),),
        ),
        Clause(
            "CFG-2",
            "A hybrid sharding strategy given none of `auto_wrap_policy`, `process_group` and "
            "`device_mesh` raises `RuntimeError`; `process_group` and `device_mesh` together "
            "raise `ValueError`.",
            scope=(("family", ("fsdp",)),),
        ),
        Clause(
            "CFG-3",
            "`device_mesh` is a `(replicate, shard)` tuple, built at `setup_environment` on the "
            "rank's device type (cpu too), or a `DeviceMesh`. A tuple whose product differs "
            "from the world size raises `ValueError` naming the tuple and the world size. "
            "Under the fsdp family the mesh is hybrid sharding's; under the fsdp2 family it "
            "asks for HSDP: every parameter is a DTensor on it, replicated over `replicate` "
            "and split along dim 0 over `shard`.",
            scope=(("family", ("fsdp", "fsdp2")),),
        ),
        Clause(
            "CFG-4",
            "`auto_wrap_policy` and `activation_checkpointing_policy` take a set of module "
            "classes, a `ModuleWrapPolicy` or `CustomPolicy`, or a callable policy. The older "
            "`activation_checkpointing` (a class or a list of classes) keeps working with a "
            "deprecation warning, and giving it together with `activation_checkpointing_policy` "
            "raises `ValueError`. This holds for the fsdp and fsdp2 families alike; under "
            "fsdp2 each module `auto_wrap_policy` selects gets its own `fully_shard`.",
            scope=(("family", ("fsdp", "fsdp2")),),
        ),
        Clause(
            "CFG-5",
            "`use_orig_params` is True unless set. With `use_orig_params=False`, "
            "`setup_module_and_optimizers` raises `ValueError`, and so does `setup_optimizer` "
            "on an optimizer holding no flattened FSDP parameter, telling the user to create "
            "the optimizer after `setup_module`.",
            scope=(("family", ("fsdp",)),),
        ),
        Clause(
            "CFG-6",
            "`cpu_offload` takes a bool or a `CPUOffload` (fsdp family), a bool or an FSDP2 "
            "`OffloadPolicy` (fsdp2 family: `CPUOffloadPolicy` offloads). Where no accelerator "
            "exists, parameter offload is refused with `ValueError` or declared `Unsupported`; "
            "it never crashes the process.",
            # model_parallel has no cpu_offload: its parallelize_fn offloads, if anything
            scope=(("family", ("fsdp", "fsdp2")),),
        ),
        Clause(
            "CFG-7",
            "The precision is one of `32-true`, `16-true`, `bf16-true`, `16-mixed`, "
            "`bf16-mixed`; any other string or object raises `ValueError` or `TypeError`.",
        ),
        Clause(
            "CFG-8",
            "model_parallel: `data_parallel_size` defaults to `auto` (the number of nodes) and "
            "`tensor_parallel_size` to `auto` (processes per node). Sizes whose product is not "
            "the world size raise `RuntimeError` naming both sizes and the world size. The "
            "mesh's dimensions are called `data_parallel` and `tensor_parallel`.",
            scope=(("family", ("model_parallel",)),),
        ),
        Clause(
            "CFG-9",
            "model_parallel: a `parallelize_fn` that returns something other than an "
            "`nn.Module` raises `TypeError`, and a module that already holds FSDP1 wrappers is "
            "refused with `TypeError`.",
            scope=(("family", ("model_parallel",)),),
        ),
        Clause(
            "CFG-10",
            "An option the strategy cannot honour is refused at construction or set-up with an "
            "error (or `Unsupported`) that names the option; it is never silently ignored. That "
            "includes a `StrategySpec` field of the other family set to anything but its "
            "default (an fsdp-only strategy given `data_parallel_size`) and an unknown key in "
            "`spec.extra`.",
        ),
    ),
)

SHARDING = Section(
    3,
    "Sharding, wrapping and activation checkpointing",
    (
        Clause(
            "SHARD-1",
            "fsdp family: under `FULL_SHARD` and `SHARD_GRAD_OP` every rank holds about one "
            "world-th of each FSDP unit's flat parameter (ceil(total / world) plus alignment "
            "padding), and the shards together are the whole model; under `NO_SHARD` every rank "
            "holds everything; `HYBRID_SHARD` on a mesh (R, S) holds shards of one S-th, "
            "replicated R times. model_parallel family: each parameter handed to `fully_shard` "
            "is a DTensor split along dim 0 over the data-parallel mesh (ceil(dim0 / dp) rows "
            "per rank), and tensor-parallel parameters have the placements their plan names. "
            "fsdp2 family: each parameter is a DTensor split along dim 0 over the mesh's shard "
            "dimension (ceil(dim0 / shard) rows per rank) and, under HSDP, replicated over its "
            "replicate dimension; the shards together are the whole model.",
            # model_parallel: the layouts with a data-parallel or a tensor-parallel
            # dimension of more than one rank (on one rank nothing is split)
            scope=(
                ("family", ("fsdp", "model_parallel", "fsdp2")),
                (
                    "sharding",
                    (
                        "FULL_SHARD",
                        "SHARD_GRAD_OP",
                        "dp",
                        "tp",
                        "dp+tp",
                        *_FSDP2_LAYOUTS,
                    ),
                ),
            ),
        ),
        Clause(
            "SHARD-2",
            "However many steps have run, the gathered full parameters are the same on every rank.",
        ),
        Clause(
            "WRAP-1",
            "fsdp family (FSDP2-1 says it of the fsdp2 family): with a set of classes or a "
            "`ModuleWrapPolicy`, each instance of those classes is an FSDP unit of its own, "
            "and the root is the only other unit. With a size-based or callable policy, the "
            "units are exactly the modules the policy picks.",
            # FSDP1's units (FullyShardedDataParallel wrappers): the fsdp2 family's units are
            # FSDPModules, and FSDP2-1 says the same of them; model_parallel's units are its
            # parallelize_fn's, not a policy's. "each instance": a subclass's instance too, a
            # same-named class of another module not (harness.clauses.words)
            scope=(("family", ("fsdp",)), ("wrap classes", ClassWords.ALL)),
        ),
        Clause(
            "WRAP-2",
            "A module the user wrapped already is left as it is; the auto-wrap policy is then "
            "ignored and a warning says so. Wrapped means, for the fsdp family, a "
            "`FullyShardedDataParallel` unit the user made, and for the fsdp2 family a module "
            "the user applied `fully_shard` to (an `FSDPModule`): it stays one, the root "
            "becomes one, and no other module does, whatever the policy selects.",
            # the user's own unit is built with the defaults (FSDP1: full sharding; fully_shard:
            # reshard after forward over a 1-D mesh of the world; float32 both): a root of
            # another sharding or precision around it is a mix torch does not support (FSDP1)
            # or the clause does not speak of (fsdp2)
            scope=(
                ("family", ("fsdp", "fsdp2")),
                ("sharding", ("FULL_SHARD", "reshard after forward")),
                ("precision", ("32-true",)),
            ),
        ),
        Clause(
            "AC-1",
            "Activation checkpointing wraps, after sharding, exactly the modules that "
            "`activation_checkpointing_policy` selects, never one checkpoint wrapper inside "
            "another; when the model already has checkpointed layers it warns and changes "
            "nothing.",
            # the families that checkpoint by their own policy (model_parallel leaves it to
            # its parallelize_fn); a policy of classes selects their instances, as WRAP-1's
            scope=(
                ("family", ("fsdp", "fsdp2")),
                ("checkpointing classes", (*ClassWords.ALL, ClassWords.NESTED)),
            ),
        ),
        Clause(
            "AC-2",
            "Activation checkpointing leaves the numbers alone: losses and gradients are those "
            "of the same run without it.",
            scope=(("family", ("fsdp", "fsdp2")),),
        ),
    ),
)

TRAINING = Section(
    4,
    "Training semantics",
    (
        Clause(
            "TRAIN-1",
            "Parity with the plain model: k optimizer steps under the strategy, each "
            "data-parallel rank on its own micro-batch (tensor-parallel peers share one), give "
            "the gathered parameters and the losses of k steps of the unsharded model in one "
            "process on all micro-batches concatenated, with the loss averaged over ranks, "
            "within the precision's tolerance. This holds for every sharding strategy, wrap "
            "policy, optimizer (SGD with momentum, Adam, AdamW) and for several parameter "
            "groups.",
        ),
        Clause(
            "TRAIN-2",
            "A parameter with `requires_grad=False` never changes and never gets a gradient. "
            "Tied parameters remain one tensor and are updated once per step.",
        ),
        Clause(
            "TRAIN-3",
            "Sizes that do not divide by the world size (down to a rank whose shard is empty) "
            "train exactly like even sizes.",
            # only a parameter split over two ranks or more can be uneven: one rank, NO_SHARD's
            # and a hybrid mesh's replicas, and tensor parallel alone split nothing unevenly
            scope=(
                ("world_size", ("2", "3", "4")),
                (
                    "sharding",
                    (
                        "FULL_SHARD",
                        "SHARD_GRAD_OP",
                        "HYBRID_SHARD",
                        "_HYBRID_SHARD_ZERO2",
                        "dp",
                        "dp+tp",
                        *_FSDP2_LAYOUTS,
                    ),
                ),
            ),
        ),
        Clause(
            "TRAIN-4",
            "What a fine-tuning recipe changes between two steps keeps TRAIN-1 parity from "
            "the next step on: `requires_grad=False` on a parameter the optimizer already holds "
            "state for, `requires_grad=True` again on a frozen one, and "
            "`optimizer.add_param_group(...)` with parameters of the set-up module. A "
            "checkpoint saved after such a change holds the frozen parameter's optimizer state "
            "and the added group, and loads back into objects with the same changes (see "
            "CKPT-STRICT-3), whenever in the session it is saved: before the first step, "
            "again after more training, or between the micro-batches of a step. A change the "
            "strategy cannot support raises a clear error that names it.",
            scope=(("moment", MOMENTS),),
        ),
        Clause(
            "SYNC-1",
            "Inside `no_backward_sync(module, enabled=True)` no gradient is reduced across "
            "ranks: n micro-batches accumulated this way followed by one synchronized backward "
            "update the model as one backward over all the data would. `enabled=False` changes "
            "nothing. Leaving the context, normally or through an exception, restores gradient "
            "sync to what it was on entry. `enabled=True` on a module that is not a sharded "
            "root raises `TypeError`.",
            scope=(("enabled", ("True", "False")),),
        ),
        Clause(
            "CLIP-1",
            "`clip_gradients_norm(module, optimizer, max_norm, norm_type=2.0, "
            "error_if_nonfinite=True)` returns the global gradient norm of order `norm_type` "
            "as `torch.nn.utils.clip_grad_norm_` computes it on the unsharded model "
            "(replicated gradients counted once), the same value on every rank, and scales the "
            "gradients as that function does, by `min(1, max_norm / (norm + 1e-6))`, so their "
            "global norm is at most `max_norm`; under `16-mixed` it unscales first. "
            "`norm_type` is any positive number, fractional ones included, or `inf` (the "
            "largest absolute value); `0`, a negative number and nan are not norms and raise "
            "`ValueError` naming the value, leaving the gradients unchanged. A non-finite norm "
            "with `error_if_nonfinite=True` raises `RuntimeError` on every rank and leaves the "
            "gradients unscaled; with `error_if_nonfinite=False` it is returned, the same on "
            "every rank (`inf`, or nan once any gradient holds nan), and the gradients are "
            "scaled all the same: an infinite norm scales them by 0, so their finite elements "
            "become 0 and their infinite ones nan. A module that is not a sharded root raises "
            "`TypeError`.",
            scope=(
                ("norm_type", ("2", "1", "inf", "1.5")),
                ("error_if_nonfinite", ("True", "False")),
            ),
        ),
        Clause(
            "PREC-1",
            "`32-true`: parameters, gradients and optimizer state are float32.",
            scope=(("precision", ("32-true",)),),
        ),
        Clause(
            "PREC-2",
            "`bf16-mixed` and `16-mixed`: the sharded master parameters and the optimizer state "
            "stay float32, while forward compute and gradient reduction use the low dtype, "
            "also for a unit whose parameters were all frozen at the model's first forward "
            "and that trains once unfrozen (it then trains like the plain model). "
            "`16-mixed` uses a sharded gradient scaler on the rank's device type (cpu too) that "
            "skips the step on all ranks when any rank saw inf or nan. model_parallel family: "
            "these dtypes hold for the mixed-precision policy its `parallelize_fn` applies, and "
            "a precision it cannot apply is `Unsupported`, not ignored.",
            scope=(
                (
                    "precision",
                    (
                        "bf16-mixed",
                        "16-mixed",
                    ),
                ),
            ),
        ),
        Clause(
            "PREC-3",
            "`bf16-true` and `16-true`: modules created inside `module_init_context` get "
            "parameters of the low dtype, and the optimizer state has that dtype too.",
            scope=(
                (
                    "precision",
                    (
                        "bf16-true",
                        "16-true",
                    ),
                ),
            ),
        ),
        Clause(
            "PREC-4",
            "Buffers take the precision's buffer dtype while computing, but checkpoints hold "
            "them at their stored dtype and shape.",
        ),
        Clause(
            "INIT-1",
            "Meta-device init (`empty_init=True`) and then `setup_module` give exactly the "
            "parameters eager init gives, nested wrap units included, when every module's "
            "`reset_parameters` is deterministic on its own (the suites seed it from the "
            "module's qualified name). Buffers are materialized and tied weights are still "
            "tied.",
            scope=(("empty_init", ("True",)),),
        ),
    ),
)
