"""A checkpoint judged as written: read as a user's own tools read it, before anything loads it.

A save that writes the wrong thing shows it the moment it returns: the file holds an
optimizer entry of shape ``(1,)`` where the plain optimizer's is ``(4,)``. Every load of that
file that follows only meets consequences (a shape error at another world size, a bare
assertion inside the strategy's own load, a collective that never ends), none of which says
what is wrong. So the checks that save and then load read the checkpoint first, in the
controller, right after the save job returned (the directory is on the shared filesystem):

- a full file with ``torch.load(weights_only=True)``, as any user can;
- a sharded directory with torch's offline converter
  (``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``: no process group), the
  result read back with ``torch.load(weights_only=True)``;

and compare it with the plain model's and the plain optimizer's state at that moment
(:func:`~suites.lib.controller.oracles.reference_run` of the saving scenario): keys, shapes,
dtypes and the model's values (within the scenario's tolerance: recomputed, not moved), and
the optimizer's step counts. The optimizer's moments are compared by shape and dtype only
here; their values are the round trip's own comparison, bitwise against the live state.

The first difference fails the check under the clause it breaks, before any load runs, and
its message names the entry and both sides: ``CKPT-RT-1: the full checkpoint as written
holds optimizer['state']['blocks.0.fc1.bias']['exp_avg']: shape (1,) where the plain
optimizer holds shape (4,) (saved at world size 4 (model_parallel, full))`` (its headline:
the message says where first, and the headline turns it around). The part after the entry
is the finding's *difference* (:func:`harness.conformance.findings.masking.difference`):
one wrong file is one finding, whichever check, parameter or family met it. A checkpoint
that cannot be read so is left to the load and its own clause (CKPT-SEC-1 for a file that
needs arbitrary unpickling).

The clauses, in the contract's terms: CKPT-RT-1 (full) and CKPT-RT-2 (sharded) for what a
round trip must carry; CKPT-REKEY-2 for a full file's names (wrapper prefixes in the model's
keys, integer ids for the optimizer's); CKPT-BUF-1 for buffers (a persistent buffer missing,
a non-persistent one written); PREC-4 for a buffer at another dtype than its stored one.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from harness.verdicts.checked_file import loading_checked_file
from suites.lib.controller.oracles import (
    assert_close,
    low_dtype,
    reference_run,
    scenario_tolerance,
)
from suites.lib.controller.tolerances import Tolerance
from suites.lib.shared.checkpoint_specs import ROUND_TRIP
from suites.lib.shared.models import build_model, clean_name
from suites.lib.shared.specs import Scenario

__all__ = [
    "Difference",
    "Plain",
    "check_written",
    "judged_if_it_fails",
    "matched",
    "plain_at_save",
    "plain_entries",
    "read_written",
    "written_difference",
]

#: the words every message of this module says (``the full checkpoint as written holds ...``)
AS_WRITTEN = "checkpoint as written"


@dataclass(frozen=True)
class Plain:
    """The plain side at the moment of a save.

    Args:
        model: the plain model's ``state_dict()`` (parameters and persistent buffers).
        optim: the plain optimizer's state keyed by parameter names (``state`` and
            ``param_groups``).
        nonpersistent: the plain model's non-persistent buffers (never written).
        buffers: the names of its state dict that are buffers, not parameters.
        stored: the dtype floating-point state is stored in (parameters, buffers and the
            optimizer's moments): the low dtype of a ``*-true`` precision, else None (as the
            plain model's own).
        precision: the precision, for messages.
        tol: how far the model's recomputed values may be from the plain model's.
    """

    model: dict[str, Tensor]
    optim: dict[str, Any]
    nonpersistent: frozenset[str]
    buffers: frozenset[str]
    stored: torch.dtype | None
    precision: str
    tol: Tolerance


@dataclass(frozen=True)
class Difference:
    """The first difference between a checkpoint as written and the plain state.

    Args:
        clause: the clause it breaks.
        entry: the entry, as a subscript path (``optimizer['state']['fc.bias']['exp_avg']``).
        what: what differs, both sides named (``shape (1,) where the plain optimizer holds
            shape (4,)``).
        verb: ``holds`` or ``lacks``.
    """

    clause: str
    entry: str
    what: str
    verb: str = "holds"

    def message(self, fmt: str, where: str = "") -> str:
        """The assertion message: the clause, where it was seen (``saved at world size 4
        (model_parallel, full)``), then what differs. The headline turns it around (what
        first: :func:`harness.conformance.findings.headlines.headline`), and the finding's key
        is what follows the entry alone."""
        seen = f"{where}: " if where else ""
        return f"{self.clause}: {seen}the {fmt} {AS_WRITTEN} {self.verb} {self.entry}: {self.what}"


def plain_at_save(scenario: Scenario) -> Plain:
    """The plain model's and optimizer's state after ``scenario``'s training: what a
    checkpoint of the sharded run saved at that moment holds."""
    ref = reference_run(scenario)
    meta = build_model(scenario.model, "meta")
    buffers = frozenset(dict(meta.named_buffers()))
    return Plain(
        model=ref.state,
        optim=ref.optim,
        nonpersistent=buffers - frozenset(meta.state_dict()),
        buffers=buffers & frozenset(meta.state_dict()),
        stored=low_dtype(scenario.precision),
        precision=scenario.precision,
        tol=scenario_tolerance(scenario),
    )


def plain_entries(scenario: Scenario) -> Plain:
    """The plain model's entries, shapes and dtypes for ``scenario``, without its training:
    for a job whose training the plain replay does not follow (two optimizers at two
    learning rates), where only what does not depend on the values is judged
    (``written_difference(..., values=False)``)."""
    model = build_model(scenario.model, "cpu")
    buffers = frozenset(dict(model.named_buffers()))
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return Plain(
        model=state,
        optim={},
        nonpersistent=buffers - frozenset(state),
        buffers=buffers & frozenset(state),
        stored=low_dtype(scenario.precision),
        precision=scenario.precision,
        tol=scenario_tolerance(scenario),
    )


def read_written(path: str, fmt: str) -> dict[str, Any] | None:
    """The checkpoint at ``path`` as a user's own tools read it, or None when it cannot be
    read so (left to the load, and to its own clause).

    A full file: ``torch.load(weights_only=True)``. A sharded directory: torch's offline
    converter (``dcp_to_torch_save``, no process group) into a scratch file, read the same
    way; ``meta.pt`` (the metadata beside it) is not part of the state compared here.
    """
    from torch.distributed.checkpoint import CheckpointException
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    try:
        if fmt == "full":
            content = torch.load(path, map_location="cpu", weights_only=True)
        else:
            with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
                # one process, no process group: what this reader is for
                warnings.filterwarnings("ignore", message=".*assuming the intent is to load")
                converted = os.path.join(scratch, "converted.pt")
                dcp_to_torch_save(path, converted)
                content = torch.load(converted, map_location="cpu", weights_only=True)
    except (Exception, CheckpointException):  # DCP's CheckpointException: a BaseException
        return None
    return content if isinstance(content, dict) else None


def written_difference(
    content: dict[str, Any],
    plain: Plain,
    fmt: str,
    *,
    model_key: str = "model",
    optim_key: str = "optimizer",
    values: bool = True,
) -> Difference | None:
    """The first difference between a checkpoint's content (:func:`read_written`) and the
    plain state, model first, or None.

    Args:
        content: the checkpoint as read.
        plain: the plain side (:func:`plain_at_save`).
        fmt: ``full`` or ``sharded`` (the clause of a round trip in that format).
        model_key: the key the model was saved under.
        optim_key: the key the optimizer was saved under.
        values: compare the model's values and the optimizer too; without, the model's
            entries, shapes and dtypes alone (:func:`plain_entries`).
    """
    clause = ROUND_TRIP[fmt]
    model = content.get(model_key)
    # a sharded directory's parts that torch's offline reader does not find (a strategy
    # that keeps its optimizer in files of its own beside the DCP directory) are left to
    # the load and to the offline conversion's clause (CKPT-RT-4): judged is what is there
    if fmt == "sharded" and model_key not in content:
        found = None
    elif not isinstance(model, dict):
        return Difference(
            clause,
            f"{_kind(model)} under {model_key!r}",
            f"the plain model's state_dict() belongs there (the file's keys: "
            f"{sorted(content, key=str)})",
        )
    else:
        found = _model_difference(model, plain, fmt, clause, model_key, values)
    if not values:
        return found
    if found is None and not (fmt == "sharded" and optim_key not in content):
        found = _optim_difference(content.get(optim_key), plain, fmt, clause, optim_key)
    return found


def check_written(
    plan_save: Scenario,
    fmt: str,
    path: str,
    *,
    where: str = "",
    model_key: str = "model",
    optim_key: str = "optimizer",
) -> str:
    """Fail with the first difference between the checkpoint at ``path`` and the plain state
    of ``plan_save`` (the scenario that trained and saved it), before anything loads it.

    Args:
        plan_save: the saving scenario (its training is replayed on the plain model).
        fmt: ``full`` or ``sharded``.
        path: the checkpoint.
        where: where it was seen, for the message (the plan's sizes and family).
        model_key: the key the model was saved under.
        optim_key: the key the optimizer was saved under.

    Returns:
        What was found right, in words (``the full checkpoint as written matches the plain
        model and optimizer``): a load that fails on it says so first
        (:func:`harness.verdicts.checked_file.loading_checked_file`); ``""`` when the
        checkpoint could not be read so.

    Raises:
        AssertionError: ``"CLAUSE: the full checkpoint as written holds ENTRY: WHAT (WHERE)"``.
    """
    content = read_written(path, fmt)
    if content is None:
        return ""
    found = written_difference(
        content, plain_at_save(plan_save), fmt, model_key=model_key, optim_key=optim_key
    )
    if found is not None:
        raise AssertionError(found.message(fmt, where))
    return matched(content, fmt, model_key=model_key, optim_key=optim_key)


def matched(
    content: Mapping[str, Any], fmt: str, *, model_key: str = "model", optim_key: str = "optimizer"
) -> str:
    """What :func:`written_difference` compared in ``content`` and found right, in words, or
    ``""``: a sharded directory is judged on what torch's offline reader finds in it."""
    sides = [
        side
        for side, key in (("model", model_key), ("optimizer", optim_key))
        if fmt == "full" or key in content
    ]
    if not sides:
        return ""
    return f"the {fmt} {AS_WRITTEN} matches the plain {' and '.join(sides)}"


@contextmanager
def judged_if_it_fails(
    fmt: str, saves: Sequence[tuple[Scenario, str]], *, where: str = "", values: bool = True
) -> Iterator[None]:
    """Around a job that saves and then loads in one go (the configuration cover's round
    trip, the moments' job), where the controller cannot judge in between: when the job
    fails and a checkpoint it wrote is wrong, the check fails with that difference instead
    (the job's failure chained to it), since the load only met a consequence of it. A job
    that failed before its checkpoints could be read, or whose checkpoints are right, fails
    as it did; when every one was read and found right, a failure raised in the load says so
    first ([Note: a load after a right file] in :mod:`harness.verdicts.checked_file`).

    Args:
        fmt: ``full`` or ``sharded``.
        saves: each checkpoint the job writes, with the scenario whose training it holds
            (the first wrong one, in this order, is told).
        where: where it was seen, for the message.
        values: ``False``: the job's training is not the scenario's (the plain replay does
            not follow it), so only the model's entries, shapes and dtypes are judged
            (:func:`plain_entries`), and a file found right so is not told as right.
    """
    try:
        yield
    except Exception as exc:
        right = []
        for scenario, path in saves:
            content = read_written(path, fmt) if os.path.exists(path) else None
            if content is None:
                continue
            plain = plain_at_save(scenario) if values else plain_entries(scenario)
            found = written_difference(content, plain, fmt, values=values)
            if found is not None:
                raise AssertionError(found.message(fmt, where)) from exc
            right.append(matched(content, fmt) if values else "")
        every = right[0] if right and len(right) == len(saves) and all(right) else ""
        with loading_checked_file(every):  # the job's own failure, told after the right files
            raise


# --- the model --------------------------------------------------------------------------------


def _model_difference(
    model: dict[Any, Any], plain: Plain, fmt: str, clause: str, key: str, values: bool = True
) -> Difference | None:
    def entry(name: Any) -> str:
        return f"{key}[{name!r}]"

    for name in sorted(set(model) - set(plain.model), key=str):
        if name in plain.nonpersistent:
            return Difference(
                "CKPT-BUF-1",
                entry(name),
                "a non-persistent buffer, which the plain model's state_dict() leaves out "
                "(a strict load into a fresh model meets it as an unexpected key)",
            )
        plain_name = _plain_name(name, plain.model) if fmt == "full" else None
        if plain_name is not None:
            return Difference(
                "CKPT-REKEY-2",
                entry(name),
                f"a wrapper's name where the plain model's state_dict() has "
                f"{plain_name!r} (torch's load_state_dict into the plain model needs "
                "plain names)",
            )
        return Difference(clause, entry(name), "an entry the plain model's state_dict() lacks")
    missing = sorted(set(plain.model) - set(model), key=str)
    if missing:
        name = missing[0]
        more = f" (and {len(missing) - 1} more it lacks)" if len(missing) > 1 else ""
        return Difference(
            "CKPT-BUF-1" if name in plain.buffers else clause,
            entry(name),
            f"the plain model's state_dict() holds it{more}",
            verb="lacks",
        )
    for name in sorted(plain.model, key=str):
        value, expected = model[name], plain.model[name]
        found = _tensor_difference(value, expected, plain, "the plain model", compare_values=values)
        if not found:
            continue
        chosen = clause
        if name in plain.buffers:  # what a checkpoint holds of a buffer: CKPT-BUF-1, PREC-4
            wrong_dtype = (
                isinstance(value, Tensor)
                and value.shape == expected.shape
                and value.dtype != _expected_dtype(expected, plain)
            )
            chosen = "PREC-4" if wrong_dtype else "CKPT-BUF-1"
        return Difference(chosen, entry(name), found)
    return None


# --- the optimizer ----------------------------------------------------------------------------


def _optim_difference(osd: Any, plain: Plain, fmt: str, clause: str, key: str) -> Difference | None:
    if fmt == "sharded" and isinstance(osd, dict) and "state" not in osd:
        # DCP writes no entry for an empty container: an optimizer that never stepped
        osd = {**osd, "state": {}}
    if not isinstance(osd, dict) or not {"state", "param_groups"} <= set(osd):
        what = (
            f"keys {sorted(osd, key=str)}" if isinstance(osd, dict) else _kind(osd)
        ) + " where the plain optimizer's state_dict() holds ['param_groups', 'state']"
        return Difference(clause, f"under {key!r}", what)
    state, groups = osd["state"], osd["param_groups"]
    expected_groups = plain.optim.get("param_groups", [])
    if not isinstance(groups, list) or len(groups) != len(expected_groups):
        count = len(groups) if isinstance(groups, list) else _kind(groups)
        return Difference(
            clause,
            f"{key}['param_groups']",
            f"{count} groups where the plain optimizer holds {len(expected_groups)}",
        )
    if not isinstance(state, dict):
        return Difference(clause, f"{key}['state']", f"{_kind(state)} where a dict belongs")
    ids = sorted((k for k in state if not isinstance(k, str)), key=str)
    if ids and fmt == "full":
        return Difference(
            "CKPT-REKEY-2",
            f"{key}['state'][{ids[0]!r}]",
            "keyed by an integer id where a full checkpoint keys optimizer state by parameter name",
        )
    held = {name for name, s in state.items() if s}
    expected = {name for name, s in plain.optim.get("state", {}).items() if s}

    def entry(name: Any, inner: str = "") -> str:
        return f"{key}['state'][{name!r}]" + (f"[{inner!r}]" if inner else "")

    for name in sorted(held - expected, key=str):
        return Difference(
            clause,
            entry(name),
            f"state {sorted(state[name], key=str)} where the plain optimizer holds none "
            "(a parameter that never stepped, or a frozen one)",
        )
    for name in sorted(expected - held, key=str):
        return Difference(
            clause,
            entry(name),
            f"the plain optimizer holds {sorted(plain.optim['state'][name])} for it",
            verb="lacks",
        )
    for name in sorted(expected, key=str):
        mine, theirs = state[name], plain.optim["state"][name]
        if not isinstance(mine, dict) or set(mine) != set(theirs):
            keys = sorted(mine, key=str) if isinstance(mine, dict) else _kind(mine)
            return Difference(
                clause, entry(name), f"{keys} where the plain optimizer holds {sorted(theirs)}"
            )
        for inner in sorted(theirs):
            found = _tensor_difference(
                mine[inner], theirs[inner], plain, "the plain optimizer", step=inner == "step"
            )
            if found:
                return Difference(clause, entry(name, inner), found)
    return None


# --- one value --------------------------------------------------------------------------------


def _expected_dtype(plain_value: Tensor, plain: Plain, *, step: bool = False) -> torch.dtype:
    if plain.stored is not None and plain_value.is_floating_point() and not step:
        return plain.stored
    return plain_value.dtype


def _tensor_difference(
    value: Any,
    plain_value: Any,
    plain: Plain,
    side: str,
    *,
    compare_values: bool = False,
    step: bool = False,
) -> str:
    """What differs between one written value and the plain one (``""``: nothing)."""
    if not isinstance(plain_value, Tensor):  # a number (an optimizer's step kept as a float)
        number = value.item() if isinstance(value, Tensor) and value.numel() == 1 else value
        if isinstance(number, (int, float)) and float(number) == float(plain_value):
            return ""
        return f"{_show(value)} where {side} holds {plain_value!r}"
    if not isinstance(value, Tensor):
        return f"{_kind(value)} where {side} holds a tensor of shape {_shape(plain_value)}"
    if value.shape != plain_value.shape:
        return f"shape {_shape(value)} where {side} holds shape {_shape(plain_value)}"
    dtype = _expected_dtype(plain_value, plain, step=step)
    if value.dtype != dtype and not (step and value.dtype.is_floating_point):
        stored = f", stored as {plain.precision} stores it," if dtype != plain_value.dtype else ""
        return f"{value.dtype} where {side}{stored} holds {dtype}"
    if step:
        if not torch.equal(value.double().cpu(), plain_value.double().cpu()):
            return f"step {_show(value)} where {side} holds step {_show(plain_value)}"
        return ""
    if compare_values:
        try:
            assert_close(value, plain_value.to(value.dtype), plain.tol, name="value")
        except AssertionError as exc:
            told = str(exc).removeprefix("value: ")
            # the tolerance's figures, not its reason (a paragraph): the report has the table
            if "(rtol=" in told:
                head, _, figures = told.partition("(rtol=")
                told = f"{head}(rtol={figures.split(':', 1)[0].rstrip(')')})"
            return f"{told} against {side}"
    return ""


def _shape(value: Tensor) -> str:
    return str(tuple(value.shape))


def _show(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"{value.item():g}" if value.numel() == 1 else f"a tensor of shape {_shape(value)}"
    return repr(value)


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"a {type(value).__name__}"


def _plain_name(name: object, plain: Mapping[str, Any]) -> str | None:
    """The plain model's key that ``name`` is with a wrapper's segments in it (FSDP1's,
    activation checkpointing's, compile's) or a wrapper's prefix before it (a module held by
    another, ``_forward_module.``), or None."""
    if not isinstance(name, str):
        return None
    if clean_name(name) in plain:
        return clean_name(name)
    parts = name.split(".")
    for cut in range(1, len(parts)):
        if ".".join(parts[cut:]) in plain:
            return ".".join(parts[cut:])
    return None
