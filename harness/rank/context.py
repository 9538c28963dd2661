"""What a rank function receives as its first argument."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast, overload

import torch
import torch.distributed as dist

from harness.contract import (
    MeshStrategy,
    Strategy,
    StrategyFactory,
    StrategySpec,
    Unsupported,
    load_factory,
    spec_field_names,
)
from harness.verdicts.attribution import tag

__all__ = ["RankContext", "StrategyAgreementError"]

_FIXED_FIELDS = frozenset({"family", "rank", "world_size", "device"})
_FACTORIES: dict[str, StrategyFactory] = {}


class StrategyAgreementError(RuntimeError):
    """Another rank's strategy factory raised, so this rank's strategy is not usable."""


@dataclass
class RankContext:
    """The rank's view of the job: who it is, where it runs, how to build the strategy.

    Args:
        rank: this rank (0 .. world_size - 1).
        world_size: the number of ranks in the job.
        device: the rank's device (``cpu`` with gloo, ``cuda:<rank>`` with NCCL).
        backend: the process-group backend (``gloo`` or ``nccl``).
        job_dir: path of the job's temp directory (see :attr:`tmp_dir`).
        job_id: the job's id (unique in the controller's session).
        factory: the strategy factory, ``module:callable`` (``--strategy``).
        strategy_options: the ``--strategy-option`` values, merged into ``spec.extra``.
    """

    rank: int
    world_size: int
    device: torch.device
    backend: str
    job_dir: str
    job_id: int = 0
    factory: str = "reference_impl:make_strategy"
    strategy_options: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"RankContext(rank={self.rank}, world_size={self.world_size}, "
            f"device={self.device}, backend={self.backend!r}, job_id={self.job_id})"
        )

    @property
    def tmp_dir(self) -> str:
        """A fresh directory for this job, the same path on every rank (created on use)."""
        os.makedirs(self.job_dir, exist_ok=True)
        return self.job_dir

    @overload
    def make_strategy(self, family: Literal["model_parallel"], **options: Any) -> MeshStrategy: ...

    @overload
    def make_strategy(self, family: str, **options: Any) -> Strategy: ...

    def make_strategy(self, family: str, **options: Any) -> Strategy:
        """Build this rank's strategy with the selected factory, agreeing across ranks.

        Every rank of the job must call this (it runs one ``all_gather_object``). If the
        factory raised :class:`Unsupported` on any rank, every rank raises it; if it raised
        anything else on some rank, that rank re-raises its error and the others raise
        :class:`StrategyAgreementError` naming it, so no rank is left waiting.

        Args:
            family: ``"fsdp"`` or ``"model_parallel"``.
            **options: ``StrategySpec`` fields (``precision``, ``sharding_strategy``, ...);
                ``extra=`` is merged over the ``--strategy-option`` values.

        Returns:
            The factory's :class:`~harness.contract.Strategy`; typed as a
            :class:`~harness.contract.MeshStrategy` for the ``model_parallel`` family (its
            strategies have a ``device_mesh``). The harness does not check either at run time:
            the suites do, clause by clause.

        Raises:
            TypeError: an option is not a ``StrategySpec`` field.
            Unsupported: the factory refused the configuration on some rank.
        """
        unknown = sorted(set(options) - (spec_field_names() - _FIXED_FIELDS))
        if unknown:
            allowed = ", ".join(sorted(spec_field_names() - _FIXED_FIELDS))
            raise TypeError(
                f"make_strategy got unknown option(s) {', '.join(unknown)}; "
                f"options must be StrategySpec fields: {allowed}."
            )
        strategy: Strategy | None = None
        mine: tuple[str, Any]
        own_error: BaseException | None = None
        try:
            extra = {**self.strategy_options, **dict(options.pop("extra", None) or {})}
            spec = StrategySpec(
                family=family,  # type: ignore[arg-type]
                rank=self.rank,
                world_size=self.world_size,
                device=self.device,
                extra=extra,
                **options,
            )
            strategy = _factory(self.factory)(spec)
            mine = ("ok", None)
        except Unsupported as exc:
            mine, own_error = ("unsupported", exc), exc
        except Exception as exc:
            # building the strategy is the first step of API-1 (see [Note: clause isolation])
            tag(exc, "API-1")
            mine, own_error = ("error", f"{type(exc).__name__}: {exc}"), exc
        verdicts: list[Any] = [None] * self.world_size
        dist.all_gather_object(verdicts, mine)
        return _agree(self.rank, verdicts, strategy, own_error)


def _factory(target: str) -> StrategyFactory:
    if target not in _FACTORIES:
        _FACTORIES[target] = load_factory(target)
    return _FACTORIES[target]


def _agree(
    rank: int, verdicts: list[Any], strategy: Strategy | None, own: BaseException | None
) -> Strategy:
    for kind, detail in verdicts:
        if kind == "unsupported":
            if isinstance(own, Unsupported):
                raise own
            raise detail
    for other, (kind, detail) in enumerate(verdicts):
        if kind == "error":
            if own is not None:
                raise own
            error = StrategyAgreementError(
                f"the strategy factory raised on rank {other} ({detail}); rank {rank} "
                "stops too so that no rank waits in a collective."
            )
            tag(error, "API-1")
            raise error
    # every rank's factory returned: ``strategy`` is what this rank's factory gave
    return cast(Strategy, strategy)
