"""Tolerances for recomputed values, per precision x optimizer, each with its reason.

CONTRACT.md: "equal" is bitwise for state that only moved between processes or files (use
:data:`EXACT`), and within this table for anything that was recomputed. Every figure below
is an absolute/relative pair for ``|actual - expected| <= atol + rtol * |expected|``, plus
``per_update``: a term added to ``atol`` per optimizer step and learning rate, for optimizers
whose update has a fixed size whatever the gradient (Adam's first steps are ``lr * sign(g)``
when ``|g| >> eps``: a gradient near zero that low precision rounds to the other sign moves
that element by up to ``2 * lr`` per step, however small the gradient error was).

Low-precision figures keep at least a 2x margin over the worst deviation of single-process
emulations of each precision over the suites' scenarios (``tests/suites_lib/
test_tolerance_fit.py`` measures it: worst ``|diff|/allowed`` over 40 scenarios each: 16-mixed 0.01,
bf16-mixed 0.24, bf16-true 0.13, 16-true (SGD) 0.04). The fp32 figures are a few
hundred ulps: a sharded fp32 run differs from the reference only by reduction order.

``16-true`` with Adam is not used for parity: Adam's second moment ``0.001 * g**2``
underflows fp16 for gradients below ~1e-2, so an update becomes ``lr * g / eps`` (up to 100x
the fp32 one); the suites train ``16-true`` with SGD and use Adam there only for dtype checks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EXACT", "TABLE", "Tolerance", "tolerance"]


@dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol + per_update * lr * steps + rtol * |expected|``.

    Args:
        rtol: relative tolerance.
        atol: absolute tolerance.
        per_update: absolute slack per (learning rate x optimizer step).
        reason: why the figure is what it is.
    """

    rtol: float
    atol: float
    per_update: float = 0.0
    reason: str = ""

    def for_run(self, lr: float, steps: int) -> Tolerance:
        """This tolerance with the per-update slack of a run of ``steps`` at ``lr`` folded in."""
        return Tolerance(
            rtol=self.rtol,
            atol=self.atol + self.per_update * lr * steps,
            reason=f"{self.reason} (+{self.per_update} x lr={lr} x steps={steps})"
            if self.per_update
            else self.reason,
        )


EXACT = Tolerance(0.0, 0.0, reason="state that only moved between processes or files: bitwise")

_FP32 = (
    "fp32 parity is recomputed math, not bitwise: the sharded run reduces gradients across "
    "ranks (sum then divide, in another order) and runs per-rank matmuls on smaller batches, "
    "so results differ from the single-process reference by a few ulps per op"
)
_FP32_ADAM = (
    _FP32 + "; Adam divides by sqrt(v)+eps, amplifying the error of a gradient element near "
    "zero (by up to lr/eps on its first step): an attention's key bias has a gradient that "
    "is zero but for rounding (softmax ignores what it adds to every score), measured up to "
    "5e-8, which eps=1e-6 turned into a 0.05 x lr difference; the suites use eps=1e-4, "
    "which keeps it below 1e-3 x lr"
)
_BF16 = (
    "bf16 keeps 8 mantissa bits: every low-precision forward/backward op rounds to ~4e-3 "
    "relative, compounded over the model's depth; the reference trains in fp32"
)
_FP16 = (
    "fp16 keeps 11 mantissa bits: ~5e-4 relative per op, compounded over the model's depth; "
    "the reference trains in fp32"
)
_SCALED = "; the suites scale the loss by 1/256 under 16-mixed (TrainPlan.loss_scale)"
_SIGN = "; Adam's update is ~lr*sign(g): an element whose gradient flips sign moves 2*lr"
_TRUE = "; parameters themselves are stored in the low dtype, so every update is rounded too"

#: (precision, optimizer family) -> Tolerance. Optimizer family: "sgd" or "adam" (Adam, AdamW).
TABLE: dict[tuple[str, str], Tolerance] = {
    ("32-true", "sgd"): Tolerance(1e-4, 1e-5, reason=_FP32),
    # per_update: 2.7e-5 (2.7e-3 x lr) measured on a 1-step, 2-micro-batch FULL_SHARD run at
    # world size 3 (SYNC-1's accumulation check, seed 7408): 1e-3 x lr was too tight
    ("32-true", "adam"): Tolerance(1e-4, 1e-5, per_update=5e-3, reason=_FP32_ADAM),
    ("bf16-mixed", "sgd"): Tolerance(5e-2, 4e-2, reason=_BF16),
    ("bf16-mixed", "adam"): Tolerance(5e-2, 4e-2, per_update=2.0, reason=_BF16 + _SIGN),
    ("16-mixed", "sgd"): Tolerance(2e-3, 1e-3, reason=_FP16 + _SCALED),
    ("16-mixed", "adam"): Tolerance(2e-3, 1e-3, per_update=2.0, reason=_FP16 + _SCALED + _SIGN),
    ("bf16-true", "sgd"): Tolerance(6e-2, 3e-2, reason=_BF16 + _TRUE),
    ("bf16-true", "adam"): Tolerance(6e-2, 3e-2, per_update=2.0, reason=_BF16 + _TRUE + _SIGN),
    ("16-true", "sgd"): Tolerance(2e-2, 8e-3, reason=_FP16 + _TRUE),
    ("16-true", "adam"): Tolerance(
        2e-2,
        8e-3,
        per_update=2.0,
        reason=_FP16 + _TRUE + _SIGN + "; fp16 Adam needs eps >= 1e-4 (1e-8 rounds to 0: NaN)",
    ),
}

#: Losses are compared with the parameters' tolerance of the same run, times this factor:
#: a loss is a mean over a batch, so its error is of the same order as one parameter's.
LOSS_FACTOR = 1.0


def tolerance(precision: str, optimizer: str, *, lr: float = 0.0, steps: int = 0) -> Tolerance:
    """The tolerance for ``steps`` optimizer steps at ``lr`` under ``precision``.

    Args:
        precision: one of the five precision strings (``"32-true"``, ``"bf16-mixed"``, ...).
        optimizer: ``"sgd"``, ``"adam"`` or ``"adamw"`` (Adam and AdamW share a row).
        lr: the largest learning rate of the run (0 when no step was taken).
        steps: the number of optimizer steps.
    """
    family = "adam" if optimizer in ("adam", "adamw") else optimizer
    try:
        row = TABLE[(precision, family)]
    except KeyError:
        known = sorted({p for p, _ in TABLE})
        raise ValueError(
            f"no tolerance for precision={precision!r}, optimizer={optimizer!r}; "
            f"precisions: {known}, optimizers: sgd, adam, adamw."
        ) from None
    return row.for_run(lr, steps)
