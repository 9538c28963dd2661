"""torch's own instruments for the cost clauses (CONTRACT.md MEM-* and COMM-*), on a rank.

- Memory: torch's ``MemTracker`` (:func:`harness.torch_compat.memory_tracker`). At rest,
  :func:`held` asks it for the bytes of the distinct storages that a module's parameters,
  buffers and gradients and an optimizer's state hold (a view and its base count once, a
  DTensor counts its local shard, an FSDP1 unit its flat parameter as it is at that moment).
  Over a span of calls, :class:`PeakMeter` runs it as a dispatch mode: every tensor made
  inside is counted too (activations, temporaries, all-gather outputs) and the peak of the
  sum is kept, by category.
- Communication: torch's ``CommDebugMode`` counts the c10d and functional collectives that
  pass through the dispatcher; :class:`CommMeter` adds, for each one, the phase of the step it
  ran in and its bytes: the collective's largest buffer (an all-gather's gathered output, a
  reduce-scatter's whole input, an all-reduce's or broadcast's tensors).

What neither sees: memory a collective backend allocates in C++ for itself, and a collective
issued below the dispatcher (none of torch's FSDP, DTensor or DCP code does that).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from harness.torch_compat import collective_ops, memory_tracker

__all__ = [
    "CATEGORIES",
    "CommMeter",
    "InstrumentMissing",
    "PeakMeter",
    "collective_kind",
    "held",
]

#: MemTracker's category names, as the cost records name them
CATEGORIES = {
    "Parameter": "params",
    "Gradient": "grads",
    "Optstate": "optimizer",
    "Buffer": "buffers",
    "Activation": "activations",
    "Temp": "temporaries",
    "Other": "other",
}


class InstrumentMissing(RuntimeError):
    """This torch lacks an instrument the cost checks measure with."""


def _tracker() -> Any:
    cls = memory_tracker()
    if cls is None:
        raise InstrumentMissing(
            f"torch {torch.__version__} has no torch.distributed._tools.mem_tracker.MemTracker: "
            "the memory clauses cannot be measured with this torch"
        )
    return cls()


def _by_category(snapshot: dict[Any, dict[Any, int]]) -> dict[str, int]:
    """One device's snapshot (the rank's own device: CPU ranks hold everything there)."""
    out = dict.fromkeys(CATEGORIES.values(), 0)
    for categories in snapshot.values():
        for category, nbytes in categories.items():
            name = CATEGORIES.get(getattr(category, "value", str(category)))
            if name is not None:
                out[name] += int(nbytes)
    out["total"] = sum(out[c] for c in CATEGORIES.values())
    return out


def held(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes the model (parameters, buffers, gradients) and the optimizer (its state) hold
    now, by category, as MemTracker counts distinct storages."""
    tracker = _tracker()
    tracker.track_external(model, optimizer)
    return _by_category(tracker.get_tracker_snapshot("current"))


class PeakMeter:
    """MemTracker over a span: ``with PeakMeter(model, optimizer) as m: ...``; then
    ``m.peak`` is the snapshot, by category, at the moment the tracked total was largest."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self._tracker = _tracker()
        self._tracker.track_external(model, optimizer)
        self.start = _by_category(self._tracker.get_tracker_snapshot("current"))
        self.peak: dict[str, int] = {}

    def __enter__(self) -> PeakMeter:
        self._tracker.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._tracker.__exit__(*exc)
        self.peak = _by_category(self._tracker.get_tracker_snapshot("peak"))

    def next_forward(self) -> None:
        """Before each forward of the model after the first: MemTracker refuses a second
        call of the root module unless its per-module statistics are cleared (the peak,
        which is all this meter reads, is kept)."""
        self._tracker.reset_mod_stats()


def collective_kind(op: str) -> str:
    """The kind of a c10d or functional collective op by its name (``_allgather_base_``,
    ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``allreduce_``, ...)."""
    name = op.lower().replace("_", "")
    for kind, marks in (
        ("reduce_scatter", ("reducescatter",)),
        ("all_gather", ("allgather",)),
        ("all_reduce", ("allreduce",)),
        ("all_to_all", ("alltoall", "shardimalltoall", "sharddimalltoall")),
        ("broadcast", ("broadcast",)),
        ("gather", ("gather",)),
        ("scatter", ("scatter",)),
        ("reduce", ("reduce",)),
    ):
        if any(mark in name for mark in marks):
            return kind
    return name


def _nbytes(value: Any) -> int:
    return sum(
        t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor)
    )


def _carries_state(values: Any) -> bool:
    """Whether a collective's tensors hold numbers of a model's state (floating point or
    complex), not metadata: the plans and object lists torch's checkpointing exchanges are
    pickled into byte tensors with integer sizes."""
    return any(
        isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
        for t in tree_leaves(values)
    )


class CommMeter(CommDebugMode):
    """torch's ``CommDebugMode``, also recording each collective's phase and bytes.

    ``with meter, meter.phase("clip"): ...`` files the collectives of the block under
    ``clip``; :attr:`log` holds ``(phase, kind, op, bytes, state)`` per collective, in order
    (``state``: its tensors are floating point, see :func:`_carries_state`), and
    ``get_comm_counts()`` has torch's counts by op.

    [Note: CommDebugMode's module tracker] ``CommDebugMode`` also attributes collectives to
    modules with a module tracker of its own, which raises ``IndexError`` in its
    post-forward hook on torch 2.13 when the model is called more than once inside the mode
    (micro-batches) or beside ``MemTracker``'s tracker. The cost records need no module
    attribution, so this meter enters the dispatch mode alone and counts with torch's own
    registry of collective ops (the functional and c10d ops ``CommDebugMode`` counts).
    """

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str, str, int, bool]] = []
        self._phase = "other"
        self._c10d, self._native_to_py = collective_ops()

    def __enter__(self) -> CommMeter:
        TorchDispatchMode.__enter__(self)
        return self

    def __exit__(self, *args: Any) -> None:
        TorchDispatchMode.__exit__(self, *args)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """File the collectives issued inside the block under ``name``."""
        before, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = before

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))
        if any(t is DTensor for t in types):
            return NotImplemented  # DTensor runs first and issues the collectives we count
        out = func(*args, **(kwargs or {}))
        packet = func._overloadpacket
        if packet in self.comm_registry or packet in self._c10d:
            packet = self._native_to_py.get(packet, packet)
            self.comm_counts[packet] += 1
            op = str(packet.__name__)
            values = (*args, *(kwargs or {}).values())
            largest = max([_nbytes(a) for a in values] + [_nbytes(out)])
            state = _carries_state((values, out))
            self.log.append((self._phase, collective_kind(op), op, largest, state))
        return out

    def summary(self, *, state_only: bool = False) -> dict[str, dict[str, list[int]]]:
        """``{phase: {kind: [bytes of each collective]}}``; with ``state_only``, only the
        collectives that carry state (floating-point tensors), not metadata."""
        out: dict[str, dict[str, list[int]]] = {}
        for phase, kind, _op, nbytes, state in self.log:
            if state or not state_only:
                out.setdefault(phase, {}).setdefault(kind, []).append(nbytes)
        return out
