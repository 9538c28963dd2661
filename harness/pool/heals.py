"""Restarts of the ranks ("heals"), and how a run reports them.

See [Note: heals are counted] in :mod:`harness.pool.rankpool`: each generation of a pool that ended
early is a :class:`Heal` with its world size, its cause and the check it happened in. The
terminal summary prints :func:`describe_heals`; the report keeps them as dictionaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["Heal", "describe_heals"]


@dataclass(frozen=True)
class Heal:
    """One restart of a pool's ranks.

    Args:
        world_size: the pool's world size.
        cause: ``crash``, ``hang``, ``broken group``, ``died between jobs`` or ``start failure``.
        check: the node id of the test that was running (``(outside a test)`` otherwise).
    """

    world_size: int
    cause: str
    check: str

    def as_dict(self) -> dict[str, object]:
        """The report's form."""
        return asdict(self)


def describe_heals(heals: Sequence[Heal]) -> list[str]:
    """Lines for the terminal: the count, then one line per world size with each cause's
    count and the checks it happened in (the first three)."""
    if not heals:
        return []
    lines = [f"the ranks were restarted {len(heals)} time{'s' if len(heals) != 1 else ''}:"]
    for size in sorted({h.world_size for h in heals}):
        parts = []
        at_size = [h for h in heals if h.world_size == size]
        for cause in dict.fromkeys(h.cause for h in at_size):
            checks = list(dict.fromkeys(h.check for h in at_size if h.cause == cause))
            shown = ", ".join(checks[:3]) + (
                f" (+{len(checks) - 3} more)" if len(checks) > 3 else ""
            )
            count = sum(h.cause == cause for h in at_size)
            parts.append(f"{count} {cause} ({shown})")
        lines.append(f"  world size {size}: " + "; ".join(parts))
    return lines
