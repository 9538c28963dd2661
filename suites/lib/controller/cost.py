"""The cost clauses' laws (CONTRACT.md MEM-* and COMM-*): bounds from the model and configuration.

Every bound here is computed from the plain model of the scenario (its tensors' sizes, built on
the meta device; its optimizer state and activation peak as the rank measured them with the
same instrument: :class:`~suites.lib.ranks.cost_jobs.CostRecord.plain`) and the configuration:
which units it makes, how many ranks share a parameter, whether units reshard after forward.
None is a figure read off the reference. The checks in ``suites/test_cost.py`` compare a rank's
:class:`~suites.lib.ranks.cost_jobs.CostRecord` with them and word a failure as a cost: who
held or moved what, against which bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from suites.lib.shared.cost_record import CostRecord, plain_dtype
from suites.lib.shared.models import build_model
from suites.lib.shared.specs import FSDP2Config, FSDPConfig, MPConfig, Scenario

__all__ = ["Law", "law_of", "mib", "where"]

#: MEM-1's alignment allowance per tensor (FSDP1 aligns each original parameter in its flat
#: parameter to 16 bytes)
ALIGN = 16
#: MEM-2's and MEM-3's tolerance on their sums
TOLERANCE = 1.05
#: COMM-2: bytes one clip collective may move per parameter tensor (one partial norm each)
NORM_BYTES = 16
_RESHARDING = ("FULL_SHARD", "HYBRID_SHARD")


def mib(nbytes: float) -> str:
    """Bytes as a short figure (KiB below one MiB: the suites' models are small)."""
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.2f} MiB"
    return f"{nbytes / 1024:.1f} KiB"


def where(scenario: Scenario) -> str:
    """The configuration, as a finding names it (one piece, no top-level comma, so findings
    group across configurations): ``fsdp (FULL_SHARD, 32-true) at world size 4``."""
    config = scenario.strategy
    if isinstance(config, FSDPConfig):
        mesh = f", mesh {config.device_mesh}" if config.device_mesh else ""
        what = f"fsdp ({config.sharding_strategy}{mesh}, {scenario.precision})"
    elif isinstance(config, FSDP2Config):
        mesh = f", HSDP mesh {config.device_mesh}" if config.device_mesh else ""
        reshard = f"reshard_after_forward={config.reshard_after_forward}"
        what = f"fsdp2 ({reshard}{mesh}, {scenario.precision})"
    else:
        assert isinstance(config, MPConfig)
        what = (
            f"model_parallel (dp {config.data_parallel_size} x tp "
            f"{config.tensor_parallel_size}, {scenario.precision})"
        )
    return f"{what} at world size {scenario.world_size}"


def _units(scenario: Scenario, model: nn.Module) -> set[str]:
    """The qualified names of the configuration's units besides the root."""
    config = scenario.strategy
    if isinstance(config, MPConfig):
        return {
            n for n, m in model.named_modules() if n and type(m).__name__ in config.fsdp_classes
        }
    return config.wrap.expected_units(model)


def _owner(name: str, units: set[str]) -> str:
    """The deepest unit whose subtree holds parameter ``name`` (``""``: the root)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in units:
            return prefix
    return ""


def _reshards_after_forward(scenario: Scenario) -> bool | int:
    config = scenario.strategy
    if isinstance(config, FSDPConfig):
        return config.sharding_strategy in _RESHARDING
    return config.reshard_after_forward


@dataclass(frozen=True)
class Law:
    """The bounds of one scenario on one rank (bytes).

    Attributes:
        shard: how many ranks share one parameter.
        params, grads, optimizer: the plain model's bytes of each category.
        tensors: the plain model's parameter tensors.
        rows: the bytes of one row of every parameter (their sum: the padding allowance).
        units: the unsharded parameter bytes of each unit (``""``: the root's own).
        activations: the plain model's activation peak on this rank's micro-batch.
        gather_ratio: bytes a gathered parameter takes per byte stored (mixed precision
            gathers in the low dtype).
        reshards: reshard after forward (True, False, or the int of FSDP2's option).
        accumulates: the plan's micro-batches accumulate under ``no_backward_sync``.
        replica_firsts: the first rank of each replica gathers a full read (FSDP1's hybrid
            shardings count ``rank0_only`` within the shard group).
        gathers_alone: units are gathered into buffers of their own even with a shard of
            one rank (FSDP2, and model_parallel's FSDP2 on a data-parallel dim of 1: measured,
            an fsdp2 unit at world size 1 without reshard after forward holds a second copy
            of its parameters), where FSDP1's ``NO_SHARD`` computes on the stored ones.
    """

    shard: int
    params: int
    grads: int
    optimizer: int
    tensors: int
    rows: int
    units: dict[str, int]
    activations: int
    gather_ratio: float
    reshards: bool | int
    accumulates: bool
    replica_firsts: bool = False
    gathers_alone: bool = False

    def share(self, category: str) -> int:
        """MEM-1: a rank's share of one category, padding and alignment included."""
        total = {"params": self.params, "grads": self.grads, "optimizer": self.optimizer}
        state_per_param = max(1, round(self.optimizer / self.params)) if self.params else 1
        copies = state_per_param if category == "optimizer" else 1
        return -(-total[category] // self.shard) + copies * (self.rows + ALIGN * self.tensors)

    @property
    def largest(self) -> int:
        """The largest unit's unsharded parameter bytes."""
        return max(self.units.values())

    def _two_largest(self) -> int:
        others = sorted((b for n, b in self.units.items() if n), reverse=True)
        return sum(others[:2])

    def in_flight_params(self) -> int:
        """MEM-2: unsharded parameters the configuration may hold at once (none where
        nothing is sharded, unless FSDP2 gathers into buffers of its own even then)."""
        if self.shard == 1 and not self.gathers_alone:
            return 0
        if self.reshards is True:
            return self.units.get("", 0) + self._two_largest()
        if self.reshards is False:
            return self.params
        return -(-self.params // int(self.reshards)) + self._two_largest()

    def in_flight_grads(self) -> int:
        """MEM-2: unsharded gradients the configuration may hold at once."""
        if self.shard == 1 and not self.gathers_alone:
            return 0
        return self.grads if self.accumulates else self._two_largest()

    def peak_bound(self) -> int:
        """MEM-2: the whole bound on a step's peak."""
        rest = sum(self.share(c) for c in ("params", "grads", "optimizer"))
        flight = self.in_flight_params() + self.in_flight_grads()
        return int(TOLERANCE * (rest + flight + 3 * self.largest + 4 * self.activations))

    def save_bound(self, rank: int) -> int:
        """MEM-3: the most a rank may hold during a full save: its share, one largest unit's
        parameters and optimizer state (one copy of the parameters where nothing is sharded)
        and, on rank 0, the whole state once (on the first rank of each replica under FSDP1's
        hybrid shardings, which count ``rank0_only`` within the shard group)."""
        rest = self.share("params") + self.share("optimizer")
        unit = self.largest * (1 + max(1, round(self.optimizer / max(1, self.params))))
        if self.shard == 1:  # nothing sharded: a read may copy the parameters it holds
            unit = self.params
        first = rank == 0 or (self.replica_firsts and rank % self.shard == 0)
        full = self.params + self.optimizer if first else 0
        return int(TOLERANCE * (rest + unit + full))

    def load_bound(self) -> int:
        """MEM-4: the most a rank may hold during a full load: its share twice (the shards it
        holds and those cut from the file before they replace them), the saved state once
        (read or mapped where the rank is), and one largest unit's parameters and optimizer
        state (one copy of the parameters where nothing is sharded)."""
        rest = self.share("params") + self.share("optimizer")
        unit = self.largest * (1 + max(1, round(self.optimizer / max(1, self.params))))
        if self.shard == 1:
            unit = self.params
        return 2 * rest + self.params + self.optimizer + unit  # padding is in the shares

    def save_gather_ceiling(self, tp: int = 1) -> int:
        """COMM-4: the most a full save may all-gather: every parameter and optimizer state
        tensor once per mesh dimension it is sharded on (a tensor-parallel one is gathered
        over the data-parallel dim to its 1/``tp`` piece, then over the tensor-parallel dim
        whole) and padding; the metadata's object gathers are not state and not counted."""
        copies = 1 + max(1, round(self.optimizer / max(1, self.params)))
        hops = 1 + (1 / tp if tp > 1 else 0)
        return int(hops * (self.params + self.optimizer)) + copies * self.padding()

    def padding(self) -> int:
        """Bytes one copy of the parameters may pad to across the shard group."""
        return (self.rows + ALIGN * self.tensors) * self.shard

    def gather_floor(self) -> int:
        """COMM-1: the fewest all-gathered bytes a synchronized micro-batch may issue (twice
        every unit but the root once, in the gathered dtype); 0 where nothing is sharded or
        units keep their parameters after forward."""
        if self.shard == 1 or self.reshards is False:
            return 0
        return int(self.gather_ratio * (2 * self.params - self.units.get("", 0)))

    def gather_ceiling(self) -> int:
        """COMM-1: the most all-gathered bytes one micro-batch may issue."""
        return 2 * self.params + 2 * (self.rows + ALIGN * self.tensors) * self.shard

    def reduce_ceiling(self) -> int:
        """COMM-1: the most gradient bytes reduced by one kind of collective in a step."""
        return self.grads + (self.rows + ALIGN * self.tensors) * self.shard


def law_of(scenario: Scenario, record: CostRecord) -> Law:
    """The bounds of ``scenario`` for the rank that measured ``record``."""
    model = build_model(scenario.model, "meta").to(plain_dtype(scenario.precision))
    units = _units(scenario, model)
    by_unit: dict[str, int] = {"": 0, **dict.fromkeys(units, 0)}
    rows = tensors = 0
    for name, param in model.named_parameters():
        nbytes = param.numel() * param.element_size()
        by_unit[_owner(name, units)] += nbytes
        tensors += 1
        rows += nbytes // max(1, param.shape[0]) if param.dim() else nbytes
    mixed = scenario.precision in ("bf16-mixed", "16-mixed")
    return Law(
        shard=scenario.shard_factor,
        params=record.plain["params"],
        grads=record.plain["grads"],
        optimizer=record.plain["optimizer"],
        tensors=tensors,
        rows=rows,
        units=by_unit,
        activations=record.plain["activations"],
        gather_ratio=0.5 if mixed else 1.0,
        reshards=_reshards_after_forward(scenario),
        accumulates=scenario.plan.micro_batches > 1,
        replica_firsts=isinstance(scenario.strategy, FSDPConfig)
        and "HYBRID" in scenario.strategy.sharding_strategy,
        gathers_alone=not isinstance(scenario.strategy, FSDPConfig),
    )
