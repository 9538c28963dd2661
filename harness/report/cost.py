"""The cost section of a report: what the cost checks measured, per configuration, and the law.

The cost checks (CONTRACT.md MEM-* and COMM-*) hand the session one measurement per
configuration they ran: its name, family, world size and every rank's bytes (at rest by
moment and category, at the step's peak by category, the collectives of a step by phase and
kind, a full save's peak). :func:`cost_of` keeps them as they came and adds, per family:

- ``series``: one point per world size of the family's main configuration (the first one
  measured at that size), the largest rank's bytes at rest after the step, at the step's peak,
  and the collectives of the synchronized micro-batch (count and bytes by kind);
- ``projection``: the per-rank law fitted to that series by least squares,
  ``bytes = fixed + sharded / world``, and what it gives at 8, 64 and 512 ranks. It is a
  projection from the measured world sizes, not a measurement, and says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["PROJECTED_WORLDS", "cost_of", "fit"]

#: the world sizes the report projects per-rank bytes to
PROJECTED_WORLDS = (8, 64, 512)
_AT_REST = "after the step"


def _largest(ranks: list[dict[str, Any]], pick: str, moment: str | None = None) -> dict[str, int]:
    """The category bytes of the rank whose total is largest."""
    rows = [(r[pick][moment] if moment else r[pick]) for r in ranks]
    rows = [row for row in rows if row]
    return max(rows, key=lambda row: row.get("total", 0)) if rows else {}


def _collectives(ranks: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    step = ranks[0]["comm"].get("step", {}) if ranks else {}
    return {kind: {"count": len(sizes), "bytes": sum(sizes)} for kind, sizes in step.items()}


def fit(points: Iterable[tuple[int, float]]) -> tuple[float, float] | None:
    """``(fixed, sharded)`` of ``bytes = fixed + sharded / world`` by least squares over
    ``(world, bytes)`` points; None with fewer than two distinct world sizes."""
    pts = [(1.0 / w, float(b)) for w, b in points]
    if len({x for x, _ in pts}) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return my - slope * mx, slope


def cost_of(measurements: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The report's ``cost`` section (see the module docstring); empty without measurements."""
    configurations = [dict(m) for m in measurements]
    if not configurations:
        return {}
    families: dict[str, dict[str, Any]] = {}
    for m in configurations:
        family = families.setdefault(m["family"], {"series": {}, "plain": {}})
        ranks = m["ranks"]
        if ranks and not family["plain"]:
            family["plain"] = dict(ranks[0]["plain"])
        point = {
            "world_size": m["world_size"],
            "configuration": m["configuration"],
            "at_rest": _largest(ranks, "rest", _AT_REST),
            "peak": _largest(ranks, "peak"),
            "collectives": _collectives(ranks),
        }
        family["series"].setdefault(str(m["world_size"]), point)
    for family in families.values():
        family["series"] = [family["series"][w] for w in sorted(family["series"], key=int)]
        law = fit((p["world_size"], p["at_rest"].get("total", 0)) for p in family["series"])
        family["projection"] = (
            {
                "law": "bytes per rank at rest = fixed + sharded / world (least squares)",
                "fixed": round(law[0]),
                "sharded": round(law[1]),
                "at": {str(w): round(law[0] + law[1] / w) for w in PROJECTED_WORLDS},
                "measured_worlds": [p["world_size"] for p in family["series"]],
                "note": "projected from the measured world sizes, not measured",
            }
            if law
            else {}
        )
    return {"configurations": configurations, "families": families}
