"""Oracles: the single-process reference and the comparisons with it (controller side).

The oracle never trusts the strategy under test:
- the expected values come from the plain, unsharded zoo model trained in ONE process on the
  concatenated batch of the data-parallel ranks, with the loss averaged over ranks
  (TRAIN-1), computed in the controller by :func:`reference_run`;
- what it is compared with was read on the ranks with torch's own APIs
  (:mod:`suites.lib.ranks.readers`), never with the strategy's save/load;
- :func:`assert_close` and friends fail with the parameter's name, the worst element's index
  and both values.

:func:`plain_train` and :func:`named_optim_state` are the plain torch side of the checkpoint
interop tests: a user's single-process run, and its optimizer state keyed like the gathered one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from suites.lib.controller.tolerances import EXACT, Tolerance, tolerance
from suites.lib.shared.models import build_model, clean_name, make_batch
from suites.lib.shared.specs import Scenario

__all__ = [
    "LOW_DTYPES",
    "Reference",
    "assert_clip_scales",
    "assert_clipped",
    "assert_close",
    "assert_close_state",
    "assert_parity",
    "assert_same_on_ranks",
    "backward_plain_step",
    "expected_dtypes",
    "low_dtype",
    "named_optim_state",
    "plain_train",
    "reference_model",
    "reference_run",
    "scenario_tolerance",
]

_LOW = {"16-true": torch.float16, "bf16-true": torch.bfloat16}


def low_dtype(precision: str) -> torch.dtype | None:
    """The parameter dtype of a ``*-true`` low precision (None otherwise)."""
    return _LOW.get(precision)


def backward_plain_step(
    model: nn.Module, scenario: Scenario, index: int, micro: int, dp: int, clip: float | None
) -> None:
    """The gradients of one step of the plain model as a sharded run with ``dp``
    data-parallel ranks and ``micro`` micro-batches takes it (the loss averaged over all of
    them and scaled by the plan's ``loss_scale``), then clipped to ``clip`` if given; the
    caller steps its optimizer."""
    plan = scenario.plan
    for m in range(micro):
        after_forward = _one_buffer_update(model)
        for r in range(dp):
            x, y = make_batch(scenario.model, plan.data_seed, index, m, r, plan.batch_size)
            loss = F.mse_loss(model(x).float(), y) * plan.loss_scale
            (loss / (dp * micro)).backward()
            after_forward()
    if clip is not None:
        params = [p for p in model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, clip)


def _one_buffer_update(model: nn.Module) -> Callable[[], None]:
    """For the forwards of one micro-batch of every data-parallel rank: a callable that,
    called after each of them (and its backward), keeps the buffers the first one left and
    undoes what the others wrote.

    [Note: one buffer update per micro-batch] Each data-parallel rank runs one forward per
    micro-batch, and a forward in training mode updates a BatchNorm's running statistics
    and counter; the plain model runs one forward per rank and micro-batch, so it would
    update them ``dp`` times as often. A model with running statistics gives every rank the
    same inputs (see [Note: running statistics see the same inputs on every rank] in
    :mod:`suites.lib.shared.models`), so every rank's update is the first rank's: the plain
    model keeps that one. Buffers no forward writes are left as they are.
    """
    kept: dict[str, Tensor] = {}

    def after_forward() -> None:
        with torch.no_grad():
            if not kept:
                kept.update({n: b.detach().clone() for n, b in model.named_buffers()})
                return
            for name, buffer in model.named_buffers():
                buffer.copy_(kept[name])

    return after_forward


def scenario_tolerance(scenario: Scenario) -> Tolerance:
    """The tolerance of ``scenario``'s whole run (its precision, optimizer, lr and steps)."""
    return tolerance(
        scenario.precision,
        scenario.optim.kind,
        lr=scenario.optim.max_lr,
        steps=scenario.plan.steps,
    )


# --- the single-process reference (runs in the controller) -------------------------------


@dataclass
class Reference:
    """What the plain model did.

    Attributes:
        losses: ``losses[step][micro][dp_rank]``: each data-parallel rank's unscaled
            micro-batch loss, before that step's update.
        norms: the total gradient norm before clipping, per step (clipped plans only).
        state: the final model state dict (parameters and persistent buffers).
        grads: the gradients of the last step (after clipping), by name.
        initial: the state dict before training.
        optim: the plain optimizer's state at the end, keyed by parameter names
            (:func:`named_optim_state`): what a checkpoint saved then must hold.
    """

    losses: list[list[list[float]]] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)
    state: dict[str, Tensor] = field(default_factory=dict)
    grads: dict[str, Tensor | None] = field(default_factory=dict)
    initial: dict[str, Tensor] = field(default_factory=dict)
    optim: dict = field(default_factory=dict)


def reference_model(scenario: Scenario) -> nn.Module:
    """The plain fp32 model; under ``*-true`` low precisions its initial values are rounded
    to that dtype first, as the strategy creates them."""
    model = build_model(scenario.model)
    low = low_dtype(scenario.precision)
    if low is not None:
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                if t.is_floating_point():  # an integer buffer (a counter) stays as it is
                    t.copy_(t.to(low).float())
    return model


def reference_run(scenario: Scenario, *, steps: int | None = None) -> Reference:
    """Train the plain model on the concatenated data of the data-parallel ranks.

    Per step, micro-batch ``i`` of rank ``r`` contributes ``loss(r, i) / (dp * m)`` to the
    gradient: the mean over ranks of each rank's ``loss / m``, as the sharded run's
    gradient reduction (mean over data-parallel ranks) and accumulation give.

    Args:
        scenario: the scenario.
        steps: override ``scenario.plan.steps`` (e.g. 0 for the initial state only).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: extra threads only contend with the ranks
    try:
        return _reference_run(scenario, scenario.plan.steps if steps is None else steps)
    finally:
        torch.set_num_threads(threads)


def _reference_run(scenario: Scenario, steps: int) -> Reference:
    plan, dp = scenario.plan, scenario.dp_size
    model = reference_model(scenario)
    ref = Reference(initial={k: v.clone() for k, v in model.state_dict().items()})
    optimizer = scenario.optim.build(model.named_parameters())
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        step_losses: list[list[float]] = []
        for micro in range(plan.micro_batches):
            per_rank = []
            after_forward = _one_buffer_update(model)  # see the note there
            for r in range(dp):
                x, y = make_batch(scenario.model, plan.data_seed, step, micro, r, plan.batch_size)
                loss = F.mse_loss(model(x).float(), y) * plan.loss_scale
                (loss / (dp * plan.micro_batches)).backward()
                per_rank.append(loss.item())
                after_forward()
            step_losses.append(per_rank)
        ref.losses.append(step_losses)
        if plan.clip is not None:
            params = [p for p in model.parameters() if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(
                params, plan.clip, plan.norm_type, plan.error_if_nonfinite
            )
            ref.norms.append(float(norm))
        ref.grads = {
            clean_name(n): None if p.grad is None else p.grad.detach().clone()
            for n, p in model.named_parameters()
        }
        optimizer.step()
    ref.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ref.optim = named_optim_state(model, optimizer)
    return ref


def plain_train(scenario: Scenario, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Train the plain model in this process for ``scenario.plan.steps`` steps (one rank's
    data, one micro-batch per step): what a user's plain torch run does."""
    plan = scenario.plan
    for step in range(plan.steps):
        x, y = make_batch(scenario.model, plan.data_seed, step, 0, 0, plan.batch_size)
        F.mse_loss(model(x).float(), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def named_optim_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """A plain (single-process) optimizer's state keyed by parameter names, like
    :func:`~suites.lib.ranks.readers.gathered_optim_state` gives for a sharded one."""
    names = {id(p): clean_name(n) for n, p in model.named_parameters()}
    state = {names[id(p)]: _cpu_copy(s) for p, s in optimizer.state.items()}
    groups = []
    for group in optimizer.param_groups:
        hyper = {k: v for k, v in group.items() if k != "params"}
        hyper["params"] = [names[id(p)] for p in group["params"]]
        groups.append(hyper)
    return {"state": state, "param_groups": groups}


def _cpu_copy(state: dict) -> dict:
    """One parameter's plain optimizer state (tensors and numbers), tensors cloned to CPU."""
    return {
        k: v.detach().to("cpu", copy=True) if isinstance(v, Tensor) else v for k, v in state.items()
    }


# --- comparisons ------------------------------------------------------------------------


def assert_close(actual: Tensor, expected: Tensor, tol: Tolerance, *, name: str) -> None:
    """Fail unless ``actual`` is within ``tol`` of ``expected`` (same shape).

    The message names ``name``, the number of bad elements, the worst element's index and
    both values, and the tolerance with its reason. Integer (and bool) tensors, such as a
    BatchNorm's ``num_batches_tracked``, are counts, never recomputed math: they must equal
    the reference exactly, dtype included, whatever ``tol`` says.
    """
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{name}: shape {tuple(actual.shape)} differs from the reference's "
            f"{tuple(expected.shape)}"
        )
    if not (actual.is_floating_point() and expected.is_floating_point()):
        if actual.dtype != expected.dtype or not torch.equal(actual.cpu(), expected.cpu()):
            raise AssertionError(
                f"{name}: {actual.dtype} {actual.tolist()} where the reference holds "
                f"{expected.dtype} {expected.tolist()} (integer state is compared exactly, "
                "dtype included)"
            )
        return
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if tol == EXACT or (tol.rtol == 0 and tol.atol == 0):
        if torch.equal(actual.cpu(), expected.cpu()) or torch.equal(a, e):
            return
        allowed = torch.zeros_like(e)
    else:
        allowed = tol.atol + tol.rtol * e.abs()
    diff = (a - e).abs()
    bad = ~(diff <= allowed)  # NaN counts as bad
    if not bool(bad.any()):
        return
    excess = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff - allowed)
    flat = int(torch.argmax(excess.reshape(-1)))
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), e.shape)) or ()
    raise AssertionError(
        f"{name}: {int(bad.sum())} of {e.numel()} elements differ; worst at index {index}: "
        f"actual={a.reshape(-1)[flat].item():.8g}, expected={e.reshape(-1)[flat].item():.8g}, "
        f"|diff|={diff.reshape(-1)[flat].item():.3g} > allowed "
        f"{allowed.reshape(-1)[flat].item():.3g} (rtol={tol.rtol}, atol={tol.atol}: "
        f"{tol.reason})"
    )


def assert_close_state(
    actual: dict[str, Tensor],
    expected: dict[str, Tensor],
    tol: Tolerance,
    *,
    what: str = "parameter",
    keys: set[str] | None = None,
) -> None:
    """Compare two state dicts key by key (``keys``: only those), missing keys included."""
    wanted = set(expected) if keys is None else keys
    missing = sorted(k for k in wanted if k not in actual)
    if missing:
        raise AssertionError(f"{what}s missing from the strategy's gathered state: {missing}")
    for key in sorted(wanted):
        assert_close(actual[key], expected[key], tol, name=f"{what} {key!r}")


def assert_same_on_ranks(values: list[dict[str, Tensor]], *, what: str) -> None:
    """SHARD-2: every rank holds bitwise the same gathered tensors as rank 0."""
    first = values[0]
    for rank, other in enumerate(values[1:], start=1):
        if set(other) != set(first):
            raise AssertionError(
                f"{what}: rank {rank} has keys {sorted(set(other) ^ set(first))} that rank 0 "
                "does not share"
            )
        for key in sorted(first):
            assert_close(other[key], first[key], EXACT, name=f"{what} {key!r} on rank {rank}")


def assert_parity(
    results: list,
    scenario: Scenario,
    ref: Reference | None = None,
    *,
    state: bool = True,
    grads: bool = False,
    norms: bool = False,
) -> Reference:
    """TRAIN-1 on every rank's result: losses (and final state, last grads, clip norms)
    equal the single-process reference within the scenario's tolerance.

    Args:
        results: one ``RankResult`` per rank (``rank``, ``dp_rank``, ``losses``, ``state``,
            ``grads``, ``norms``).
        scenario: the scenario that was run.
        ref: the reference (computed here when None).
        state: compare the final gathered state.
        grads: compare the last step's gathered gradients (where the reference has one).
        norms: compare the clip norms.
    """
    ref = ref if ref is not None else reference_run(scenario)
    tol = scenario_tolerance(scenario)
    dp_ranks = sorted(r.dp_rank for r in results)
    per = scenario.world_size // scenario.dp_size
    if dp_ranks != sorted(list(range(scenario.dp_size)) * per):
        raise AssertionError(
            f"distributed_sampler_kwargs['rank'] over the ranks is {dp_ranks}; expected each of "
            f"0..{scenario.dp_size - 1} exactly {per} time(s) (data-parallel size "
            f"{scenario.dp_size})"
        )
    for r in results:
        where = f"rank {r.rank}"
        if len(r.losses) != len(ref.losses):
            raise AssertionError(f"{where}: {len(r.losses)} steps ran, expected {len(ref.losses)}")
        for step, losses in enumerate(r.losses):
            for micro, loss in enumerate(losses):
                assert_close(
                    torch.tensor(loss),
                    torch.tensor(ref.losses[step][micro][r.dp_rank]),
                    tol,
                    name=f"{where}: loss of step {step}, micro-batch {micro}",
                )
        if norms:
            assert_close(
                torch.tensor(r.norms), torch.tensor(ref.norms), tol, name=f"{where}: clip norms"
            )
        if state:
            assert_close_state(r.state, ref.state, tol, what=f"{where}: parameter/buffer")
        if grads:
            wanted = {k: v for k, v in ref.grads.items() if v is not None}
            got = {k: v for k, v in r.grads.items() if v is not None}
            assert_close_state(got, wanted, tol, what=f"{where}: gradient")
    return ref


def assert_clip_scales(
    where: str, norm: float, scaled: float | None, max_norm: float, tol: Tolerance
) -> None:
    """CLIP-1's scaling, against the strategy's own returned ``norm``: the clip scaled this
    rank's gradients (``scaled``, :func:`suites.lib.ranks.readers.scaling`) by
    ``min(1, max_norm / (norm + 1e-6))``.

    It needs no reference, so a check asks it before comparing norms or losses with the
    plain model: a clip that returns the right norm but scales wrongly is named here, at its
    first step, instead of as the different norms and losses of the steps after it. The
    message's ``gradients[…]`` is the same wrong value whichever check meets it, so they join
    one finding.
    """
    if scaled is None or not math.isfinite(norm):
        # nothing seen on this rank; a non-finite norm's scaling is compared element-wise
        return
    expected = min(1.0, max_norm / (norm + 1e-6))
    if abs(scaled - expected) <= tol.rtol * expected:
        return
    raise AssertionError(
        f"{where}: gradients[…]: scaled by {scaled:.6g} in clip_gradients_norm(max_norm="
        f"{max_norm:g}), which returned the norm {norm:.6g}; torch scales by min(1, max_norm / "
        f"(norm + 1e-6)) = {expected:.6g} (rtol={tol.rtol}, the scenario's: the factor is "
        "rounded to the gradients' dtype)"
    )


def assert_clipped(results: list, scenario: Scenario, *, clause_id: str = "") -> None:
    """:func:`assert_clip_scales` for every rank and clipped step of a training run (each
    ``RankResult``'s ``norms`` and ``scaled``), first step first; ``clause_id`` prefixes the
    message for a check of several clauses."""
    if scenario.plan.clip is None:
        return
    tol = scenario_tolerance(scenario)
    prefix = f"{clause_id}: " if clause_id else ""
    for step in range(max((len(r.norms) for r in results), default=0)):
        for r in results:
            if step < len(r.norms) and step < len(r.scaled):
                where = f"{prefix}rank {r.rank}, step {step}"
                assert_clip_scales(where, r.norms[step], r.scaled[step], scenario.plan.clip, tol)


LOW_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16}


def half_dtype(precision: str) -> torch.dtype:
    """The low dtype of a ``bf16-*`` or ``16-*`` precision (mixed or true)."""
    return LOW_DTYPES[precision.split("-")[0]]


def expected_dtypes(precision: str) -> dict[str, torch.dtype]:
    """Stored (parameters, optimizer state) and compute dtypes a precision must give
    (PREC-1, PREC-2, PREC-3)."""
    if precision == "32-true":
        return {"stored": torch.float32, "compute": torch.float32}
    if precision.endswith("-mixed"):
        return {"stored": torch.float32, "compute": half_dtype(precision)}
    return {"stored": half_dtype(precision), "compute": half_dtype(precision)}
