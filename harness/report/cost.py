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

The writers read it through the helpers below (:func:`human_bytes`, :func:`footprint`,
:func:`categories`, :func:`collectives_text`, :func:`configuration_row`): report.html draws
the series as a chart (:mod:`harness.report.chart`) and tables, report.md and summary.md
print them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "CATEGORIES",
    "FOOTPRINT",
    "PROJECTED_WORLDS",
    "categories",
    "collectives_text",
    "configuration_row",
    "cost_of",
    "fit",
    "footprint",
    "human_bytes",
]

#: the world sizes the report projects per-rank bytes to
PROJECTED_WORLDS = (8, 64, 512)
_AT_REST = "after the step"
#: the categories of a rank's bytes, in the order the writers print them (``total`` last)
CATEGORIES = ("params", "grads", "optimizer", "buffers", "activations", "temporaries", "other")
#: what the plain model's footprint adds up (the horizontal line of the chart)
FOOTPRINT = ("params", "grads", "optimizer")


def _largest(ranks: list[dict[str, Any]], pick: str, moment: str | None = None) -> dict[str, int]:
    """The category bytes of the rank whose total is largest."""
    rows = [(r[pick][moment] if moment else r[pick]) for r in ranks]
    rows = [row for row in rows if row]
    return max(rows, key=lambda row: row.get("total", 0)) if rows else {}


def _collectives(ranks: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    return _by_kind(ranks[0]["comm"].get("step", {}) if ranks else {})


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


def human_bytes(value: float) -> str:
    """``903 B``, ``6.55 KiB``, ``415 KiB``, ``1.2 MiB``: three significant figures in IEC
    units (1 KiB = 1024 bytes); report.json keeps the exact bytes."""
    if abs(value) < 1024:
        return f"{value:.0f} B"
    scaled, unit = value / 1024, "KiB"
    for larger in ("MiB", "GiB", "TiB"):
        if abs(scaled) < 999.5:
            break
        scaled, unit = scaled / 1024, larger
    return f"{scaled:.3g} {unit}"


def footprint(plain: Mapping[str, int]) -> int:
    """The plain model's params + grads + optimizer state: what one process holds to train it
    without sharding (activations aside)."""
    return sum(int(plain.get(key, 0)) for key in FOOTPRINT)


def categories(rows: Iterable[Mapping[str, int]]) -> list[str]:
    """The categories any of ``rows`` holds bytes of, in :data:`CATEGORIES` order (others
    after, by name), then ``total``: the columns of a table that leaves out empty ones."""
    rows = list(rows)
    held = {key for row in rows for key, value in row.items() if value and key != "total"}
    known = [key for key in CATEGORIES if key in held]
    return [*known, *sorted(held - set(CATEGORIES)), "total"]


def collectives_text(collectives: Mapping[str, Mapping[str, int]]) -> str:
    """``all_gather 17 (271 KiB), reduce_scatter 9 (138 KiB)``: count and bytes per kind;
    ``none`` for a step without collectives."""
    if not collectives:
        return "none"
    return ", ".join(
        f"{kind} {c['count']} ({human_bytes(c['bytes'])})" for kind, c in collectives.items()
    )


def _by_kind(sizes: Mapping[str, list[int]]) -> dict[str, dict[str, int]]:
    return {kind: {"count": len(s), "bytes": sum(s)} for kind, s in sizes.items()}


def configuration_row(measured: Mapping[str, Any]) -> dict[str, Any]:
    """One configuration of ``configurations`` as the full table prints it: each rank's total
    at rest after the step, the largest rank's categories at rest and at the peak, rank 0's
    collectives by phase (count and bytes per kind) and the largest full-save peak (None
    when the configuration did not save)."""
    ranks = list(measured.get("ranks", []))
    saves = [r["save_peak"].get("total", 0) for r in ranks if r.get("save_peak")]
    return {
        "configuration": measured["configuration"],
        "family": measured["family"],
        "world_size": measured["world_size"],
        "at_rest_per_rank": [r["rest"].get(_AT_REST, {}).get("total", 0) for r in ranks],
        "at_rest": _largest(ranks, "rest", _AT_REST),
        "peak": _largest(ranks, "peak"),
        "collectives": {
            phase: _by_kind(kinds) for phase, kinds in (ranks[0]["comm"] if ranks else {}).items()
        },
        "save_peak": max(saves) if saves else None,
    }
