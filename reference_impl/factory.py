"""``make_strategy(spec)``: the default plug-in of shardcheck (``--strategy``, CONTRACT.md).

The harness calls it on every rank with a :class:`harness.StrategySpec`. It builds the
reference :class:`~reference_impl.fsdp.FSDPStrategy`,
:class:`~reference_impl.model_parallel.ModelParallelStrategy` or
:class:`~reference_impl.fsdp2.FSDP2Strategy` from the spec's fields (plus
``spec.extra`` as keyword arguments), raises :class:`harness.Unsupported` for what cannot run
on this machine, and lets the constructors' ``ValueError``/``TypeError`` through: the suites
check those errors through this function.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from harness.contract import MeshStrategy, Strategy, StrategySpec, Unsupported
from reference_impl.fsdp_options import has_accelerator

if TYPE_CHECKING:
    from reference_impl.fsdp import FSDPStrategy
    from reference_impl.fsdp2 import FSDP2Strategy
    from reference_impl.model_parallel import ModelParallelStrategy

    # mypy proves the reference strategies offer the surface the suites use (harness.contract):
    # a member missing or a signature the suites cannot call is an error on these lines.
    _FSDP_CONFORMS: type[Strategy] = FSDPStrategy
    _MODEL_PARALLEL_CONFORMS: type[MeshStrategy] = ModelParallelStrategy
    _FSDP2_CONFORMS: type[Strategy] = FSDP2Strategy

__all__ = ["make_strategy"]


def make_strategy(spec: StrategySpec) -> Strategy:
    """Build this rank's reference strategy for ``spec``.

    Args:
        spec: the harness's description of the strategy; ``spec.device`` becomes the
            strategy's root device.

    Raises:
        harness.Unsupported: a configuration this machine cannot run (CPU offload of
            parameters without an accelerator; a CUDA device without CUDA).
        ValueError, TypeError: invalid options, from the strategy constructors.
    """
    device = torch.device(spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise Unsupported("CUDA is not available on this machine", "device", str(device))
    if spec.family == "fsdp":
        _refuse_foreign_fields(spec, (*_MODEL_PARALLEL_FIELDS, *_FSDP2_ONLY_FIELDS))
        return _make_fsdp(spec, device)
    if spec.family == "model_parallel":
        _refuse_foreign_fields(spec, (*_FSDP_FIELDS, *_FSDP2_ONLY_FIELDS))
        return _make_model_parallel(spec, device)
    if spec.family == "fsdp2":
        _refuse_foreign_fields(spec, ("sharding_strategy", *_MODEL_PARALLEL_FIELDS))
        return _make_fsdp2(spec, device)
    raise ValueError(  # StrategySpec validates the family; kept for hand-built specs
        f"StrategySpec.family={spec.family!r} is not supported; use 'fsdp', 'model_parallel' "
        "or 'fsdp2'."
    )


_FSDP_FIELDS = (
    "sharding_strategy",
    "auto_wrap_policy",
    "activation_checkpointing_policy",
    "state_dict_type",
    "cpu_offload",
    "device_mesh",
)
_FSDP2_ONLY_FIELDS = ("reshard_after_forward",)
_MODEL_PARALLEL_FIELDS = (
    "parallelize_fn",
    "data_parallel_size",
    "tensor_parallel_size",
    "save_distributed_checkpoint",
)


def _refuse_foreign_fields(spec: StrategySpec, names: tuple[str, ...]) -> None:
    """CFG-10: a field of the other family set to a non-default value is an error, not a no-op."""
    defaults = {f.name: f.default for f in dataclasses.fields(StrategySpec)}
    for name in names:
        value = getattr(spec, name)
        if value != defaults[name]:
            raise ValueError(
                f"StrategySpec.{name}={value!r} is not an option of the {spec.family!r} "
                f"family; leave it at its default ({defaults[name]!r})."
            )


def _offloads_params(value: Any) -> bool:
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if isinstance(value, OffloadPolicy):  # FSDP2's: only CPUOffloadPolicy offloads
        return isinstance(value, CPUOffloadPolicy)
    return bool(getattr(value, "offload_params", value))


def _refuse_offload_here(value: Any, device: torch.device) -> None:
    """CFG-6: parameter offload without an accelerator is a valid option this machine cannot
    run (the constructors refuse it with ValueError; the factory says Unsupported first)."""
    if _offloads_params(value) and (device.type == "cpu" or not has_accelerator()):
        raise Unsupported(
            "parameter offload to CPU needs the model on an accelerator; this rank's device "
            f"is {device}",
            "cpu_offload",
            value,
        )


def _make_fsdp(spec: StrategySpec, device: torch.device) -> Strategy:
    from reference_impl.fsdp import FSDPStrategy

    extra = dict(spec.extra)
    cpu_offload = extra.pop("cpu_offload", spec.cpu_offload)
    _refuse_offload_here(cpu_offload, device)
    options: dict[str, Any] = {
        "precision": spec.precision,
        "sharding_strategy": spec.sharding_strategy,
        "auto_wrap_policy": spec.auto_wrap_policy,
        "activation_checkpointing_policy": spec.activation_checkpointing_policy,
        "state_dict_type": spec.state_dict_type,
        "cpu_offload": cpu_offload,
        "device_mesh": spec.device_mesh,
        "root_device": device,
    }
    options.update(extra)
    return FSDPStrategy(**options)


def _make_model_parallel(spec: StrategySpec, device: torch.device) -> MeshStrategy:
    from reference_impl.model_parallel import ModelParallelStrategy

    options: dict[str, Any] = {
        "parallelize_fn": spec.parallelize_fn,
        "data_parallel_size": spec.data_parallel_size,
        "tensor_parallel_size": spec.tensor_parallel_size,
        "save_distributed_checkpoint": spec.save_distributed_checkpoint,
        "precision": spec.precision,
        "root_device": device,
    }
    options.update(spec.extra)
    return ModelParallelStrategy(**options)


def _make_fsdp2(spec: StrategySpec, device: torch.device) -> Strategy:
    from reference_impl.fsdp2 import FSDP2Strategy

    extra = dict(spec.extra)
    cpu_offload = extra.pop("cpu_offload", spec.cpu_offload)
    _refuse_offload_here(cpu_offload, device)
    options: dict[str, Any] = {
        "precision": spec.precision,
        "auto_wrap_policy": spec.auto_wrap_policy,
        "reshard_after_forward": spec.reshard_after_forward,
        "activation_checkpointing_policy": spec.activation_checkpointing_policy,
        "state_dict_type": spec.state_dict_type,
        "cpu_offload": cpu_offload,
        "device_mesh": spec.device_mesh,
        "root_device": device,
    }
    options.update(extra)
    return FSDP2Strategy(**options)
