"""Precision plugins shared by the reference strategies (CONTRACT.md PREC-1..4, CFG-7).

A plugin says, for one precision mode, which dtype modules are created in, how inputs are
converted, what runs around the forward pass, which FSDP1 ``MixedPrecision`` / FSDP2
``MixedPrecisionPolicy`` applies, and how ``backward`` and the optimizer step go (through a
sharded gradient scaler for ``16-mixed``). Strategies get one through
:func:`resolve_precision` and call :meth:`Precision.bind_device` once the rank's device is known.

The five modes:

===============  ==================  =================  ==================================
mode             parameters stored   forward compute    gradient reduction
===============  ==================  =================  ==================================
``32-true``      float32             float32            float32
``16-true``      float16             float16            float16
``bf16-true``    bfloat16            bfloat16           bfloat16
``16-mixed``     float32             float16 (autocast)  float16, with a ShardedGradScaler
``bf16-mixed``   float32             bfloat16 (autocast) bfloat16
===============  ==================  =================  ==================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.nn.modules.batchnorm import _NormBase
from torch.optim import Optimizer

from reference_impl.fsdp2_dtypes import resolve_unit_dtypes

__all__ = [
    "PRECISION_MODES",
    "BF16MixedPrecision",
    "BF16TruePrecision",
    "FP16MixedPrecision",
    "FP16TruePrecision",
    "FP32Precision",
    "Precision",
    "resolve_precision",
]

PRECISION_MODES = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Generator[None, None, None]:
    """Make ``dtype`` the default floating dtype inside the block; restore it on exit."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _cast_floating(data: Any, dtype: torch.dtype) -> Any:
    """Cast every floating-point tensor in a (nested) collection to ``dtype``."""
    if isinstance(data, Tensor):
        return data.to(dtype) if torch.is_floating_point(data) else data
    if isinstance(data, Mapping):
        return type(data)({k: _cast_floating(v, dtype) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(_cast_floating(v, dtype) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_cast_floating(v, dtype) for v in data)
    return data


def running_stats_modules(module: nn.Module) -> list[nn.Module]:
    """The modules of ``module`` that keep running statistics (BatchNorm, InstanceNorm with
    ``track_running_stats``): floating buffers their forward updates in training mode."""
    return [m for m in module.modules() if isinstance(m, _NormBase) and m.track_running_stats]


class _RunningStatsCast:
    """Forward hooks of one module with running statistics: its floating buffers take the
    dtype its parameters compute in for the call, and what the call wrote goes back into
    the stored buffers.

    [Note: running statistics compute in the parameters' dtype] Under a mixed precision
    the sharded parameters of a BatchNorm reach its forward in the low dtype (FSDP1's
    ``param_dtype``, FSDP2's ``MixedPrecisionPolicy``), while its running statistics stay at
    their stored float32 (buffer_dtype=None: see [Note: buffers stay at their stored
    dtype]). ``batch_norm`` refuses that mix ("expected scalar type BFloat16 but found
    Float": a low weight needs low running statistics), so a model with a BatchNorm could
    not run a step. FSDP1's own answer, a unit of its own with mixed precision off for
    every ``_BatchNorm`` (``MixedPrecision._module_classes_to_ignore``), applies only with an
    auto-wrap policy and adds units the policy did not pick (WRAP-1), and FSDP2 has none. So
    the strategy casts such a module's floating buffers to its parameters' dtype around its
    forward, as a buffer dtype of the low precision would, and afterwards writes every
    buffer the forward changed back into the stored float32 tensor: every one of them, the
    running mean and the running variance alike. A cast back that restores one buffer of a
    module only leaves the others in the low dtype, in the state dict too, or drops their
    update (the class of pytorch/pytorch#93391, "FSDP state_dict transformations of modules
    with persistent buffers fail with mixed precision enabled": FSDP1's state-dict hook
    iterated with a stale variable, so a module with several persistent buffers did not get
    each of them transformed back). A buffer the
    forward did not change keeps its stored value to the bit (PREC-4), and integer buffers
    (``num_batches_tracked``) are never cast. The statistics are thus updated in the
    compute dtype, as the rest of the forward is, and checkpoints hold them at their
    stored dtype.
    """

    def __init__(self) -> None:
        self._held: dict[str, tuple[Tensor, Tensor]] = {}

    def before(self, module: nn.Module, args: Any) -> None:
        weight = getattr(module, "weight", None)
        if not isinstance(weight, Tensor) or not weight.is_floating_point():
            return
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_floating_point() and buffer.dtype != weight.dtype:
                low = buffer.to(weight.dtype)
                self._held[name] = (buffer, low)
                module._buffers[name] = low

    def after(self, module: nn.Module, args: Any, output: Any) -> None:
        held, self._held = self._held, {}
        with torch.no_grad():
            for name, (stored, low) in held.items():
                if not torch.equal(low, stored.to(low.dtype)):  # the forward wrote it
                    stored.copy_(low)
                module._buffers[name] = stored


class Precision:
    """Base precision plugin: the ``32-true`` behaviour, parametrized by dtypes.

    Subclasses only set class attributes; strategies use the methods.

    Attributes:
        name: the mode's string (one of :data:`PRECISION_MODES`).
        param_dtype: dtype that parameters are created and stored in (``module_init_context``).
        compute_dtype: dtype of the forward computation and of gradient reduction.
        device_type: device type the plugin was bound to (``"cpu"`` until ``bind_device``).
    """

    name: str = "32-true"
    param_dtype: torch.dtype = torch.float32
    compute_dtype: torch.dtype = torch.float32

    def __init__(self) -> None:
        self.device_type: str = "cpu"
        self._scaler: ShardedGradScaler | None = None
        self._hooks: list[Any] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @property
    def is_mixed(self) -> bool:
        """Whether master parameters stay float32 while compute runs in a lower dtype."""
        return self.param_dtype != self.compute_dtype

    def bind_device(self, device: torch.device) -> None:
        """Tell the plugin the rank's device (called by ``setup_environment``).

        Args:
            device: the strategy's root device; its type selects the autocast device type and
                the device of the gradient scaler (``16-mixed``), CPU included.
        """
        self.device_type = torch.device(device).type

    @property
    def scaler(self) -> ShardedGradScaler | None:
        """The gradient scaler (``16-mixed`` only), else ``None``."""
        return self._scaler

    def module_init_context(self) -> AbstractContextManager[None]:
        """Context in which modules are created: the default dtype is ``param_dtype``."""
        if self.param_dtype == torch.float32:
            return contextlib.nullcontext()
        return _default_dtype(self.param_dtype)

    def forward_context(self) -> AbstractContextManager[Any]:
        """Context to run the forward pass (and the loss) in."""
        return self.module_init_context()

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point tensors in ``data`` to the dtype the module expects."""
        return _cast_floating(data, self.param_dtype)

    def cast_running_stats(self, module: nn.Module) -> None:
        """Let every module of ``module`` with running statistics compute them in the dtype
        its parameters reach the forward in, and keep them stored as they were (see
        [Note: running statistics compute in the parameters' dtype]). Strategies call it
        on the module they set up; the hooks go at :meth:`teardown`.
        """
        for sub in running_stats_modules(module):
            cast = _RunningStatsCast()
            self._hooks.append(sub.register_forward_pre_hook(cast.before))
            self._hooks.append(sub.register_forward_hook(cast.after, always_call=True))

    def mixed_precision_config(self) -> MixedPrecision | None:
        """FSDP1 ``MixedPrecision`` for this mode, or ``None`` when none is needed.

        True modes need none: parameters already live in the compute dtype.
        """
        return None

    def mixed_precision_policy(self) -> MixedPrecisionPolicy | None:
        """FSDP2 ``MixedPrecisionPolicy`` a ``parallelize_fn`` may pass to ``fully_shard``."""
        return None

    def backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        """Run ``tensor.backward(*args, **kwargs)``, scaling it first when a scaler is used.

        Args:
            tensor: the loss.
            module: the module the loss came from: its FSDP2 units that a frozen first
                forward left without mixed-precision dtypes get them first (see
                :mod:`reference_impl.fsdp2_dtypes`).
            *args: passed to ``Tensor.backward``.
            **kwargs: passed to ``Tensor.backward``.
        """
        if module is not None:
            resolve_unit_dtypes(module)
        if self._scaler is not None:
            tensor = self._scaler.scale(tensor)
        tensor.backward(*args, **kwargs)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """Step ``optimizer`` (through the scaler, which skips steps with inf/nan gradients)."""
        if self._scaler is None:
            return optimizer.step(**kwargs)
        result = self._scaler.step(optimizer, **kwargs)
        self._scaler.update()
        return result

    def unscale_gradients(self, optimizer: Optimizer, module: nn.Module | None = None) -> None:
        """Divide the gradients of ``optimizer`` by the loss scale (no-op without a scaler);
        with ``module``, also those of its parameters that ``optimizer`` does not hold.

        [Note: unscaling what no optimizer holds] The scaler unscales one optimizer's
        parameters. A parameter that trains but that no optimizer holds yet (fine-tuning
        code adds it with ``add_param_group`` later) keeps a gradient 65536 times too large,
        and a norm over the module's gradients (CLIP-1: as the unsharded model computes it)
        is then that gradient's alone: a 16-mixed session clipped every gradient to about
        1/500 of the plain model's. Such gradients are divided here too; no optimizer steps
        with them, and a second unscale in the same step is refused by the scaler first.
        """
        if self._scaler is None:
            return
        self._scaler.unscale_(optimizer)
        if module is None:
            return
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        inverse = 1.0 / self._scaler.get_scale()
        for param in module.parameters():
            if param.grad is not None and id(param) not in held:
                param.grad.mul_(inverse)

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state (empty without a scaler)."""
        return {} if self._scaler is None else self._scaler.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if self._scaler is not None and state_dict:
            self._scaler.load_state_dict(dict(state_dict))

    def teardown(self) -> None:
        """Release what the plugin holds: the running-statistics hooks (and the scaler)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()


class FP32Precision(Precision):
    """``32-true``: everything in float32 (PREC-1)."""


class _TruePrecision(Precision):
    """Low-precision parameters, compute and optimizer state (PREC-3)."""

    def forward_context(self) -> AbstractContextManager[Any]:
        return _default_dtype(self.param_dtype)


class FP16TruePrecision(_TruePrecision):
    """``16-true``: parameters, compute and optimizer state in float16."""

    name = "16-true"
    param_dtype = torch.float16
    compute_dtype = torch.float16


class BF16TruePrecision(_TruePrecision):
    """``bf16-true``: parameters, compute and optimizer state in bfloat16."""

    name = "bf16-true"
    param_dtype = torch.bfloat16
    compute_dtype = torch.bfloat16


class _MixedPrecision(Precision):
    """float32 master parameters; forward and gradient reduction in ``compute_dtype`` (PREC-2)."""

    def forward_context(self) -> AbstractContextManager[Any]:
        return torch.autocast(device_type=self.device_type, dtype=self.compute_dtype)

    def mixed_precision_config(self) -> MixedPrecision | None:
        # [Note: buffers stay at their stored dtype] FSDP1 casts buffers to buffer_dtype in
        # place and back for the state dict, so a float32 buffer would lose its low bits at
        # the first forward and every checkpoint after it would carry the rounded value
        # (seen in the cross-family round trip, CKPT-RT-6). The precision's buffer dtype is
        # therefore the stored one (buffer_dtype=None); autocast still computes in the low
        # dtype (PREC-2, PREC-4). No module class is exempted from the low param dtype
        # (FSDP1 exempts _BatchNorm by default, with units of their own that no policy
        # picked: WRAP-1); see [Note: running statistics compute in the parameters' dtype].
        return MixedPrecision(
            param_dtype=self.compute_dtype,
            reduce_dtype=self.compute_dtype,
            buffer_dtype=None,
            _module_classes_to_ignore=(),
        )

    def mixed_precision_policy(self) -> MixedPrecisionPolicy | None:
        return MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=self.compute_dtype)


class FP16MixedPrecision(_MixedPrecision):
    """``16-mixed``: float16 compute with a ``ShardedGradScaler`` on the rank's device type.

    The scaler all-reduces its inf/nan flag over the world, so when any rank sees a
    non-finite gradient every rank skips the step and backs the scale off.
    """

    name = "16-mixed"
    compute_dtype = torch.float16

    def bind_device(self, device: torch.device) -> None:
        super().bind_device(device)
        if self._scaler is None:
            self._scaler = ShardedGradScaler(device=self.device_type)

    def teardown(self) -> None:
        super().teardown()
        self._scaler = None


class BF16MixedPrecision(_MixedPrecision):
    """``bf16-mixed``: bfloat16 compute, float32 master parameters; no scaler needed."""

    name = "bf16-mixed"
    compute_dtype = torch.bfloat16


_PLUGINS: dict[str, type[Precision]] = {
    cls.name: cls
    for cls in (
        FP32Precision,
        FP16TruePrecision,
        BF16TruePrecision,
        FP16MixedPrecision,
        BF16MixedPrecision,
    )
}


def resolve_precision(value: str | Precision | None) -> Precision:
    """Turn a precision string (or plugin) into a plugin instance (CFG-7).

    Args:
        value: one of ``"32-true"``, ``"16-true"``, ``"bf16-true"``, ``"16-mixed"``,
            ``"bf16-mixed"``; a :class:`Precision` instance (returned as is); or ``None``
            for ``"32-true"``.

    Raises:
        ValueError: an unknown precision string.
        TypeError: any other kind of object.
    """
    if value is None:
        return FP32Precision()
    if isinstance(value, Precision):
        return value
    if isinstance(value, str):
        cls = _PLUGINS.get(value)
        if cls is None:
            raise ValueError(
                f"precision={value!r} is not supported; use one of {', '.join(PRECISION_MODES)} "
                "(or a reference_impl.precision.Precision instance)."
            )
        return cls()
    raise TypeError(
        f"precision={value!r} (type {type(value).__name__}) is not supported; pass one of the "
        f"strings {', '.join(PRECISION_MODES)} or a reference_impl.precision.Precision instance."
    )
