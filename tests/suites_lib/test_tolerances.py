"""The tolerance table: every precision x optimizer has a reasoned figure."""

from __future__ import annotations

import pytest

from suites.lib.controller.tolerances import TABLE, tolerance

PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_every_row_exists_with_a_reason(precision: str, optimizer: str) -> None:
    tol = tolerance(precision, optimizer)
    assert tol.reason and tol.rtol > 0 and tol.atol > 0


def test_fp32_is_tightest_and_adam_gets_per_update_slack() -> None:
    assert all(TABLE[("32-true", "sgd")].rtol <= row.rtol for row in TABLE.values())
    tol = tolerance("bf16-mixed", "adam", lr=0.01, steps=3)
    assert tol.atol == pytest.approx(TABLE[("bf16-mixed", "adam")].atol + 2.0 * 0.01 * 3)
    assert "lr=0.01" in tol.reason
    assert "eps >= 1e-4" in tolerance("16-true", "adamw").reason


def test_unknown_row_is_refused() -> None:
    with pytest.raises(ValueError, match=r"precision='64-true'.*precisions:"):
        tolerance("64-true", "sgd")
