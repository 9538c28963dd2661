"""What the cost clauses' rank job measures (CONTRACT.md MEM-* and COMM-*), as data both sides
read: the rank job (:mod:`suites.lib.ranks.cost_jobs`) fills a :class:`CostRecord`, the
controller's laws (:mod:`suites.lib.controller.cost`) read it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["CostRecord", "describe", "plain_dtype"]


@dataclass
class CostRecord:
    """What one rank measured (bytes; picklable).

    Attributes:
        rank: the global rank.
        plain: the plain model of the scenario on this rank: ``params``, ``buffers``,
            ``grads`` and ``optimizer`` (after one step), ``activations`` (activations and
            temporaries at the peak of one micro-batch's forward and backward).
        rest: what the model and optimizer hold at rest, by moment (``after setup``,
            ``gradients held``: after the step's backward, before clipping and the optimizer
            step; ``after the step``: after ``optimizer_step`` and ``zero_grad``), by
            category.
        peak: the measured step's peak, by category.
        comm: the measured step's collectives: ``{phase: {kind: [bytes, ...]}}``, phases
            ``accumulate`` (micro-batches inside ``no_backward_sync``), ``step`` (the last
            micro-batch's forward and backward), ``clip``, ``optimizer step``.
        save_peak: rank's peak during a full save, by category (empty when the
            configuration saved in the sharded format, or not at all).
        save_comm: the full save's collectives that carry state (floating-point tensors, not
            the metadata's object gathers), ``{kind: [bytes, ...]}``.
        load_peak: rank's peak while loading that full checkpoint back (the model and
            optimizer of the save), by category; ``rest["after a load"]`` is what they hold
            once it returned.
        load_comm: the full load's collectives that carry state, ``{kind: [bytes, ...]}``.
        sharded_comm: a sharded save's and its load's collectives, when the configuration
            was measured with the sharded format: ``{"save"|"load": {kind: [bytes, ...]}}``.
        sharded_state: those of them that carry state (floating-point tensors), not
            metadata, in the same form.
    """

    rank: int
    plain: dict[str, int] = field(default_factory=dict)
    rest: dict[str, dict[str, int]] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    comm: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    save_peak: dict[str, int] = field(default_factory=dict)
    save_comm: dict[str, list[int]] = field(default_factory=dict)
    load_peak: dict[str, int] = field(default_factory=dict)
    load_comm: dict[str, list[int]] = field(default_factory=dict)
    sharded_comm: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    sharded_state: dict[str, dict[str, list[int]]] = field(default_factory=dict)


def plain_dtype(precision: str) -> torch.dtype:
    """The dtype the plain model's parameters are stored in under ``precision`` (``*-true``
    stores the low dtype; the mixed precisions keep float32)."""
    return {"bf16-true": torch.bfloat16, "16-true": torch.float16}.get(precision, torch.float32)


def describe(record: CostRecord) -> dict[str, Any]:
    """The record as plain data (for the report)."""
    return asdict(record)
