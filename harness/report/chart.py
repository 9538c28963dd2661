"""The cost charts of ``report.html``: bytes per rank at rest against world size, inline SVG.

Two charts, drawn from ``report.cost["families"]`` (:mod:`harness.report.cost`), no script:

- ``<svg id="cost-chart">``: what was measured. x is the world size (1 to the largest
  measured), y the largest rank's bytes at rest after the step, from 0. One series per family
  (``<polyline class="series" data-family=...>`` and its points, ``class="point"``), the plain
  model's params + grads + optimizer as a dashed horizontal line (``class="plain-model"``)
  and a legend (``class="legend"``) naming each family.
- ``<svg id="cost-projection">``: the projection, on log scales so that 1 to 512 ranks fit.
  The measured points again (solid), the fitted law ``fixed + sharded / world`` over the whole
  range as a dashed line (``<polyline class="projection" data-family=...>``) and its values at
  8, 64 and 512 ranks as hollow points (``class="point projected"``). Its title says it is a
  projection, not a measurement.

Families whose measured points coincide (the same layout reached through two families) are
drawn widest first, so each stays visible, and the legend says which they repeat. Every point
carries ``data-world`` and ``data-bytes`` and a ``<title>`` with its value, for a reader who
hovers and for tests.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harness.report.cost import PROJECTED_WORLDS, footprint, human_bytes

__all__ = ["cost_charts"]

_WIDTH, _HEIGHT = 700, 300
_LEFT, _PLOT_RIGHT, _TOP, _BOTTOM = 72, 446, 34, 252  # the plot area; the legend is right of it
_INSET = 14  # pixels between the axes and the first and last world size
_COLOURS = ("#0969da", "#bc4c00", "#8250df", "#1a7f37", "#bf3989", "#4d2d00", "#57606a")
_SHAPES = ("circle", "square", "triangle", "diamond")
_PLAIN = "#57606a"
_SAMPLES = 48  # points of the projected law's line


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _marker(shape: str, x: float, y: float, size: float, colour: str, attrs: str) -> str:
    """One point: ``shape`` centred on (x, y), filled with ``colour`` (hollow when ``attrs``
    holds ``projected``), its ``<title>`` inside ``attrs``' element."""
    hollow = "projected" in attrs
    paint = f'fill="{"#fff" if hollow else colour}" stroke="{colour}" stroke-width="1.5"'
    if shape == "circle":
        return f'<circle cx="{_num(x)}" cy="{_num(y)}" r="{_num(size)}" {paint} {attrs}'
    if shape == "square":
        s = size * 0.9
        return (
            f'<rect x="{_num(x - s)}" y="{_num(y - s)}" width="{_num(2 * s)}" '
            f'height="{_num(2 * s)}" {paint} {attrs}'
        )
    if shape == "triangle":
        s = size * 1.2
        points = f"{_num(x)},{_num(y - s)} {_num(x + s)},{_num(y + s * 0.8)} " + (
            f"{_num(x - s)},{_num(y + s * 0.8)}"
        )
    else:
        s = size * 1.25
        points = f"{_num(x)},{_num(y - s)} {_num(x + s)},{_num(y)} " + (
            f"{_num(x)},{_num(y + s)} {_num(x - s)},{_num(y)}"
        )
    return f'<polygon points="{points}" {paint} {attrs}'


def _close(shape: str) -> str:
    return {"circle": "</circle>", "square": "</rect>"}.get(shape, "</polygon>")


def _point(
    shape: str, x: float, y: float, size: float, colour: str, cls: str, data: str, title: str
) -> str:
    return (
        _marker(shape, x, y, size, colour, f'class="{cls}" {data}')
        + f"><title>{_e(title)}</title>{_close(shape)}"
    )


def _linear_ticks(top: float) -> list[float]:
    """Ticks from 0 past ``top`` at 1, 2, 2.5 or 5 times a power of ten of a binary unit, so
    that each reads as a round figure (``200 KiB``)."""
    unit = 1024 ** max(0, min(4, int(math.log(max(top, 1.0), 1024))))
    raw = max(top / unit / 5, 1e-9)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw) * unit
    return [i * step for i in range(math.ceil(top / step) + 1)]


def _log_ticks(low: float, high: float) -> list[float]:
    """1, 10 and 100 of each binary unit (``1 KiB``, ``10 KiB``, ``100 KiB``, ``1 MiB``)
    between ``low`` and ``high``."""
    marks = sorted(m * 1024**k for k in range(6) for m in (1, 10, 100))
    return [t for t in marks if low <= t <= high]


def _families(cost: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, fam) for name, fam in cost.get("families", {}).items() if fam.get("series")]


def _points(family: Mapping[str, Any]) -> list[tuple[int, int]]:
    return [(p["world_size"], p["at_rest"].get("total", 0)) for p in family["series"]]


def _repeats(families: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """Each family whose measured points are those of a family before it, and that family."""
    seen: dict[tuple[tuple[int, int], ...], str] = {}
    same: dict[str, str] = {}
    for name, family in families:
        key = tuple(_points(family))
        if key in seen:
            same[name] = seen[key]
        else:
            seen[key] = name
    return same


def _plain_lines(families: list[tuple[str, dict[str, Any]]]) -> dict[int, list[str]]:
    """The plain model's footprint and the families measured against it (one model in a run
    gives one line; families of other models give one each)."""
    lines: dict[int, list[str]] = {}
    for name, family in families:
        if family.get("plain"):
            lines.setdefault(footprint(family["plain"]), []).append(name)
    return lines


def _style(index: int, count: int) -> tuple[str, str, float, float]:
    """Colour, marker shape, line width and marker size of the ``index``-th of ``count``
    series: the first drawn widest, so a later series on the same points leaves it visible."""
    colour = _COLOURS[index % len(_COLOURS)]
    shape = _SHAPES[index % len(_SHAPES)]
    extra = count - 1 - index
    return colour, shape, 2.0 + 2.5 * extra, 4.0 + 2.0 * extra


def _legend(
    families: list[tuple[str, dict[str, Any]]], same: Mapping[str, str], extra: Sequence[str]
) -> str:
    """The legend right of the plot: a sample of each family's line and marker and its name,
    then ``extra`` lines already drawn as SVG."""
    rows = []
    x = _PLOT_RIGHT + 24
    y = _TOP + 8
    for index, (name, _) in enumerate(families):
        colour, shape, _, _ = _style(index, len(families))
        note = f" (same as {same[name]})" if name in same else ""
        rows.append(
            f'<g class="legend-entry" data-family="{_e(name)}">'
            f'<line x1="{x}" y1="{y}" x2="{x + 22}" y2="{y}" stroke="{colour}" '
            f'stroke-width="2.5"/>'
            + _marker(shape, x + 11, y, 4.0, colour, 'class="legend-marker"')
            + ">"
            + _close(shape)
            + f'<text x="{x + 30}" y="{y + 4}">{_e(name)}{_e(note)}</text></g>'
        )
        y += 20
    for line in extra:
        rows.append(line.format(x=x, y=y, x2=x + 22, tx=x + 30, ty=y + 4))
        y += 20
    return '<g class="legend">' + "".join(rows) + "</g>"


_PLAIN_KEY = (
    '<g class="legend-entry plain-key"><line x1="{x}" y1="{y}" x2="{x2}" y2="{y}" '
    f'stroke="{_PLAIN}" stroke-width="1.5" stroke-dasharray="6 4"/>'
    '<text x="{tx}" y="{ty}">plain model: params + grads</text></g>'
)
_PLAIN_KEY_2 = (
    '<g class="legend-entry"><text x="{tx}" y="{ty}">+ optimizer (one process)</text></g>'
)
_MEASURED_KEY = (
    '<g class="legend-entry measured-key"><line x1="{x}" y1="{y}" x2="{x2}" y2="{y}" '
    'stroke="#1f2328" stroke-width="2"/><text x="{tx}" y="{ty}">measured</text></g>'
)
_PROJECTED_KEY = (
    '<g class="legend-entry projection-key"><line x1="{x}" y1="{y}" x2="{x2}" y2="{y}" '
    'stroke="#1f2328" stroke-width="1.5" stroke-dasharray="5 4"/>'
    '<text x="{tx}" y="{ty}">projection (not measured)</text></g>'
)


def _frame(
    svg_id: str,
    title: str,
    x_ticks: list[tuple[float, str]],
    y_ticks: list[tuple[float, str]],
    x_label: str,
    y_label: str,
) -> list[str]:
    """The SVG's opening, its title, the grid, the axes and their labels."""
    out = [
        f'<svg id="{svg_id}" class="chart" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" width="{_WIDTH}" height="{_HEIGHT}" role="img" '
        f'aria-labelledby="{svg_id}-title">',
        f'<title id="{svg_id}-title">{_e(title)}</title>',
        f'<text class="chart-title" x="{_LEFT}" y="18">{_e(title)}</text>',
    ]
    for y, label in y_ticks:
        out.append(
            f'<line class="grid" x1="{_LEFT}" y1="{_num(y)}" x2="{_PLOT_RIGHT}" y2="{_num(y)}"/>'
            f'<text class="tick" x="{_LEFT - 6}" y="{_num(y + 4)}" text-anchor="end">'
            f"{_e(label)}</text>"
        )
    for x, label in x_ticks:
        out.append(
            f'<line class="grid" x1="{_num(x)}" y1="{_TOP}" x2="{_num(x)}" y2="{_BOTTOM}"/>'
            f'<text class="tick" x="{_num(x)}" y="{_BOTTOM + 16}" text-anchor="middle">'
            f"{_e(label)}</text>"
        )
    middle = (_TOP + _BOTTOM) / 2
    out += [
        f'<line class="axis" x1="{_LEFT}" y1="{_BOTTOM}" x2="{_PLOT_RIGHT}" y2="{_BOTTOM}"/>',
        f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_BOTTOM}"/>',
        f'<text class="axis-label" x="{(_LEFT + _PLOT_RIGHT) / 2}" y="{_BOTTOM + 38}" '
        f'text-anchor="middle">{_e(x_label)}</text>',
        f'<text class="axis-label" x="14" y="{middle}" text-anchor="middle" '
        f'transform="rotate(-90 14 {middle})">{_e(y_label)}</text>',
    ]
    return out


def _plain(lines: Mapping[int, list[str]], to_y: Callable[[float], float], many: bool) -> list[str]:
    out = []
    for size, names in lines.items():
        y = _num(to_y(size))
        whose = f" ({', '.join(names)})" if many else ""
        out.append(
            f'<g class="plain-model" data-bytes="{size}">'
            f'<line x1="{_LEFT}" y1="{y}" x2="{_PLOT_RIGHT}" y2="{y}" stroke="{_PLAIN}" '
            f'stroke-width="1.5" stroke-dasharray="6 4"/>'
            f'<text x="{_PLOT_RIGHT - 4}" y="{_num(to_y(size) - 5)}" text-anchor="end">'
            f"plain model{_e(whose)}: {_e(human_bytes(size))}</text>"
            f"<title>plain model{_e(whose)}: params + grads + optimizer, "
            f"{size} bytes</title></g>"
        )
    return out


def _series(
    index: int,
    count: int,
    name: str,
    family: Mapping[str, Any],
    to_x: Callable[[float], float],
    to_y: Callable[[float], float],
) -> list[str]:
    """One family's measured polyline and points."""
    colour, shape, width, size = _style(index, count)
    pts = _points(family)
    coords = " ".join(f"{_num(to_x(w))},{_num(to_y(b))}" for w, b in pts)
    out = [
        f'<polyline class="series" data-family="{_e(name)}" points="{coords}" fill="none" '
        f'stroke="{colour}" stroke-width="{width}" stroke-linejoin="round" '
        f'stroke-opacity="0.9"/>'
    ]
    for point, (world, total) in zip(family["series"], pts, strict=True):
        out.append(
            _point(
                shape, to_x(world), to_y(total), size, colour, "point",
                f'data-family="{_e(name)}" data-world="{world}" data-bytes="{total}"',
                f"{name}, world size {world}: {human_bytes(total)} per rank at rest "
                f"({total} bytes; {point['configuration']})",
            )
        )  # fmt: skip
    return out


def _measured(families: list[tuple[str, dict[str, Any]]], same: Mapping[str, str]) -> str:
    worlds = sorted({w for _, fam in families for w, _ in _points(fam)})
    plain = _plain_lines(families)
    top = max([b for _, fam in families for _, b in _points(fam)] + list(plain) + [1]) * 1.05
    y_ticks = _linear_ticks(top)
    high, span = y_ticks[-1], max(worlds[-1] - 1, 1)

    def to_x(world: float) -> float:
        return _LEFT + _INSET + (world - 1) / span * (_PLOT_RIGHT - _LEFT - 2 * _INSET)

    def to_y(size: float) -> float:
        return _BOTTOM - size / high * (_BOTTOM - _TOP)

    out = _frame(
        "cost-chart",
        "Bytes per rank at rest (after the step), measured",
        [(to_x(w), str(w)) for w in range(1, worlds[-1] + 1)],
        [(to_y(t), human_bytes(t)) for t in y_ticks],
        "world size (ranks)",
        "bytes per rank at rest",
    )
    out += _plain(plain, to_y, len(plain) > 1)
    for index, (name, family) in enumerate(families):
        out += _series(index, len(families), name, family, to_x, to_y)
    out.append(_legend(families, same, [_PLAIN_KEY, _PLAIN_KEY_2] if plain else []))
    return "\n".join([*out, "</svg>"])


def _projected(families: list[tuple[str, dict[str, Any]]], same: Mapping[str, str]) -> str:
    laws = {name: fam["projection"] for name, fam in families if fam.get("projection")}
    measured_worlds = [w for _, fam in families for w, _ in _points(fam)]
    last = max([*PROJECTED_WORLDS, *measured_worlds])
    curves = {
        name: [
            (w, law["fixed"] + law["sharded"] / w)
            for w in (2 ** (math.log2(last) * i / _SAMPLES) for i in range(_SAMPLES + 1))
        ]
        for name, law in laws.items()
    }
    values = [b for _, fam in families for _, b in _points(fam)]
    values += [b for law in laws.values() for b in law["at"].values()]
    plain = _plain_lines(families)
    positive = [v for v in [*values, *plain] if v > 0] or [1]
    low, high = min(positive) / 1.6, max(positive) * 1.6
    span_x, span_y = math.log2(last), math.log10(high / low)

    def to_x(world: float) -> float:
        return _LEFT + _INSET + math.log2(world) / span_x * (_PLOT_RIGHT - _LEFT - 2 * _INSET)

    def to_y(size: float) -> float:
        return _BOTTOM - math.log10(max(size, low) / low) / span_y * (_BOTTOM - _TOP)

    x_ticks = [2**k for k in range(int(math.log2(last)) + 1)]
    out = _frame(
        "cost-projection",
        "Projection to 8, 64 and 512 ranks: fitted, not measured",
        [(to_x(w), str(w)) for w in x_ticks],
        [(to_y(t), human_bytes(t)) for t in _log_ticks(low, high)],
        "world size (ranks, log scale)",
        "bytes per rank at rest (log scale)",
    )
    out += _plain(plain, to_y, len(plain) > 1)
    for index, (name, family) in enumerate(families):
        colour, shape, width, size = _style(index, len(families))
        if name in curves:
            coords = " ".join(f"{_num(to_x(w))},{_num(to_y(b))}" for w, b in curves[name] if b > 0)
            out.append(
                f'<polyline class="projection" data-family="{_e(name)}" points="{coords}" '
                f'fill="none" stroke="{colour}" stroke-width="{_num(1.5 + (width - 2) / 2.5)}" '
                f'stroke-dasharray="5 4"/>'
            )
        out += _series(index, len(families), name, family, to_x, to_y)
        for world, total in laws.get(name, {}).get("at", {}).items():
            if total <= 0:
                continue  # a law fitted to noise can reach zero: no place on a log scale
            out.append(
                _point(
                    shape, to_x(int(world)), to_y(total), size, colour, "point projected",
                    f'data-family="{_e(name)}" data-world="{world}" data-bytes="{total}"',
                    f"{name}, world size {world}: {human_bytes(total)} per rank at rest, "
                    "projected (not measured)",
                )
            )  # fmt: skip
    keys = [_MEASURED_KEY, _PROJECTED_KEY] + ([_PLAIN_KEY, _PLAIN_KEY_2] if plain else [])
    out.append(_legend(families, same, keys))
    return "\n".join([*out, "</svg>"])


def cost_charts(cost: Mapping[str, Any]) -> list[str]:
    """The measured chart and, when a law was fitted, the projection chart (empty when no
    family has a series)."""
    families = _families(cost)
    if not families:
        return []
    same = _repeats(families)
    charts = [_measured(families, same)]
    if any(fam.get("projection") for _, fam in families):
        charts.append(_projected(families, same))
    return charts
