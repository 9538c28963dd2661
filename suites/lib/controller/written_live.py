"""A checkpoint judged as written against a plain model that lives in the controller.

:func:`suites.lib.controller.written.check_written` replays a scenario's training on the
plain model to know what a save must hold. A check that trains its plain twin step by step
in the controller (the resume machine of CKPT-RT-5: steps, saves and loads drawn one rule at
a time) already holds that state at each save: :func:`plain_now` reads it, and
:func:`check_written_now` judges the checkpoint against it, before a later segment loads it.
So a save that writes what the plain state lacks (optimizer state created before the first
step, say) fails the resume check as written, with the same difference the round trip
reports ([Note: one cause, one finding] in :mod:`harness.conformance.findings.one_cause`), not
as the tolerance failure its resumed training meets steps later.
"""

from __future__ import annotations

from torch import nn
from torch.optim import Optimizer

from suites.lib.controller.oracles import low_dtype, named_optim_state
from suites.lib.controller.tolerances import Tolerance
from suites.lib.controller.written import Plain, matched, read_written, written_difference
from suites.lib.shared.models import ModelSpec, build_model

__all__ = ["check_written_now", "plain_now"]


def plain_now(
    model: nn.Module, optimizer: Optimizer, spec: ModelSpec, precision: str, tol: Tolerance
) -> Plain:
    """The plain side as it is now: ``model``'s ``state_dict()`` and ``optimizer``'s state
    keyed by parameter names (copies), with the buffers of a model built from ``spec``.

    Args:
        model: the plain model, trained as far as the sharded run that saved.
        optimizer: its optimizer.
        spec: the model's spec (which buffers it has, persistent or not).
        precision: the precision of the sharded run (what dtype its state is stored in).
        tol: how far the saved model's values may be from ``model``'s.
    """
    meta = build_model(spec, "meta")
    buffers = frozenset(dict(meta.named_buffers()))
    return Plain(
        model={k: v.detach().clone() for k, v in model.state_dict().items()},
        optim=named_optim_state(model, optimizer),
        nonpersistent=buffers - frozenset(meta.state_dict()),
        buffers=buffers & frozenset(meta.state_dict()),
        stored=low_dtype(precision),
        precision=precision,
        tol=tol,
    )


def check_written_now(plain: Plain, fmt: str, path: str, *, where: str = "") -> str:
    """Fail with the first difference between the checkpoint at ``path`` and ``plain``
    (:func:`plain_now`), as :func:`~suites.lib.controller.written.check_written` does.

    Returns:
        What was found right, in words, or ``""`` when the checkpoint could not be read.

    Raises:
        AssertionError: ``"CLAUSE: WHERE: the full checkpoint as written holds ENTRY: WHAT"``.
    """
    content = read_written(path, fmt)
    if content is None:
        return ""
    found = written_difference(content, plain, fmt)
    if found is not None:
        raise AssertionError(found.message(fmt, where))
    return matched(content, fmt)
