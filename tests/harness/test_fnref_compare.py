"""Rank-side assertion explanations match pytest's, whatever pytest's explainer signature."""

from __future__ import annotations

from harness.wire.fnref import _reprcompare


def test_a_failed_dict_comparison_names_the_differing_items() -> None:
    text = _reprcompare("==", {"lr": 0.1, "betas": (0.9, 0.99)}, {"lr": 0.2, "betas": (0.9, 0.99)})
    assert text is not None
    assert "Differing items" in text and "{'lr': 0.1} != {'lr': 0.2}" in text


def test_a_comparison_pytest_cannot_explain_gives_none() -> None:
    assert _reprcompare("<", 1, 2) is None
