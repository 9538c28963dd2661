"""Controller-side checks of the checkpoint suites.

Moved state is compared bitwise (:func:`tree_diff`, dtype and shape included) and every
failure names its SPEC clause and where it happened (rank, world sizes, family, format).
:func:`check_refusal` judges an error case recorded on a rank (raised what, and whether the
files on disk stayed as they were: :func:`suites.lib.shared.files.files_digest` before and
after). :func:`standard_form` is the suite's own conversion of name-keyed optimizer state to
torch's integer form. :func:`convert_offline` is the one place the suites call reference
code: the offline converter (an offline tool, not the strategy under test; CKPT-RT-4).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from suites.lib.shared.checkpoint_specs import make_metadata, plain_metadata

if TYPE_CHECKING:
    from suites.lib.shared.checkpoint_specs import CkptPlan

__all__ = [
    "assert_loaded_equals_saved",
    "assert_same_model",
    "assert_same_optim",
    "check_refusal",
    "convert_offline",
    "standard_form",
    "tree_diff",
]


def assert_loaded_equals_saved(
    plan: CkptPlan, saved: list[dict], loaded: list[dict], *, clause: str, what: str = ""
) -> None:
    """Every loading rank holds bitwise what rank 0 of the saving job read, and got all
    the metadata back (none was requested)."""
    expected = saved[0]
    meta = plain_metadata(make_metadata(plan.meta))
    for rank, out in enumerate(loaded):
        where = f"load rank {rank}, {plan.worlds}{what}"
        if out["world_size"] != plan.load.world_size:
            raise AssertionError(f"{where}: the job ran at world size {out['world_size']}")
        assert_same_model(out["model"], expected["model"], clause=clause, where=where)
        assert_same_optim(out["optim"], expected["optim"], clause=clause, where=where)
        found = tree_diff(out["returned"], meta, "returned metadata")
        if found:
            raise AssertionError(f"CKPT-LOAD-2: {where}: {found}")


def tree_diff(actual: Any, expected: Any, path: str = "") -> str | None:
    """The first difference between two nested values (tensors bitwise, dtype included)."""
    if isinstance(expected, Tensor) or isinstance(actual, Tensor):
        if not (isinstance(actual, Tensor) and isinstance(expected, Tensor)):
            return f"{path}: {type(actual).__name__} where {type(expected).__name__} was saved"
        if actual.dtype != expected.dtype or actual.shape != expected.shape:
            return (
                f"{path}: {actual.dtype}{tuple(actual.shape)} where "
                f"{expected.dtype}{tuple(expected.shape)} was saved"
            )
        if not torch.equal(actual.cpu(), expected.cpu()):
            bad = int((actual.cpu() != expected.cpu()).sum())
            return f"{path}: {bad} of {expected.numel()} elements differ from what was saved"
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            keys = set(actual) if isinstance(actual, dict) else type(actual).__name__
            return f"{path}: keys {_keys(keys)} where {_keys(set(expected))} were saved"
        for key in sorted(expected, key=str):
            found = tree_diff(actual[key], expected[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{path}: {actual!r} where {expected!r} was saved"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            found = tree_diff(a, e, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if actual == expected else f"{path}: {actual!r} where {expected!r} was saved"


def _keys(keys: Any) -> str:
    return str(sorted(keys, key=str)) if isinstance(keys, set) else str(keys)


def assert_same_model(actual: dict, expected: dict, *, clause: str, where: str) -> None:
    """Bitwise equality of two gathered model state dicts; the message names the clause."""
    found = tree_diff(actual, expected, "model")
    if found:
        raise AssertionError(f"{clause}: {where}: {found}")


def _sorted_groups(osd: dict) -> dict:
    groups = [{**g, "params": sorted(g.get("params", []))} for g in osd.get("param_groups", [])]
    return {"state": osd.get("state", {}), "param_groups": groups}


def assert_same_optim(actual: dict, expected: dict, *, clause: str, where: str) -> None:
    """Bitwise equality of two gathered (name-keyed) optimizer state dicts, hyper-parameters
    of every group included; the message names the clause."""
    found = tree_diff(_sorted_groups(actual), _sorted_groups(expected), "optimizer")
    if found:
        raise AssertionError(f"{clause}: {where}: {found}")


def check_refusal(
    record: dict, expected: tuple[str, ...], clause: str, what: str, words: tuple[str, ...] = ()
) -> None:
    """The controller's verdict on one :func:`attempt` record: raised one of ``expected``
    (an ``Exception``), the message mentions every one of ``words``, the files unchanged."""
    problem = None
    if record["type"] is None:
        problem = "nothing was raised"
    elif not record["is_exception"]:
        problem = (
            f"raised {record['type']}, which is not an Exception (torch's "
            "CheckpointException must reach the caller as RuntimeError)"
        )
    elif not set(expected) & set(record["mro"]):
        problem = (
            f"raised {record['type']}({record['message']!r}); expected {' or '.join(expected)}"
        )
    else:
        missing = [w for w in words if w.lower() not in record["message"].lower()]
        if missing:
            problem = f"the message {record['message']!r} does not mention {missing}"
        elif not record["unchanged"]:
            problem = "the files on disk changed"
    if problem:
        raise AssertionError(f"{clause}: {what}: {problem}")


def standard_form(named: dict, order: list[list[str]] | None = None) -> dict:
    """The suite's own conversion of a name-keyed optimizer state dict to torch's integer
    form: ids ``0..n-1`` in ``param_groups`` order (``order``: the names of each group)."""
    order = order or [list(g["params"]) for g in named["param_groups"]]
    ids = {name: i for i, name in enumerate(n for group in order for n in group)}
    groups = [
        {**g, "params": [ids[n] for n in names]}
        for g, names in zip(named["param_groups"], order, strict=True)
    ]
    return {"state": {ids[n]: v for n, v in named["state"].items()}, "param_groups": groups}


def convert_offline(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Convert a sharded checkpoint to a full one with the reference's offline converter.

    The only reference code the suites call: the converter is an offline tool (no process
    group), not part of the strategy under test (CKPT-RT-4).
    """
    from reference_impl.checkpoint import convert_sharded_to_full

    convert_sharded_to_full(src, dst)
