"""report.html's cost chart in a real browser: headless Chromium lays out a page written from a
small report with a cost section (``cost_sample.py``; no ranks run) and a script appended to a
copy of the page measures what the browser drew and writes it into the DOM, which
``--dump-dom`` hands back.

The page itself has no script; the copy gets two: one first in ``<head>`` that collects
errors (``window.onerror``, failed loads, ``console.error``/``warn``), one last in ``<body>``
that measures. Chromium's own log of the page's console (``--enable-logging=stderr``, lines
with ``CONSOLE``) must be empty too. Without Chromium on PATH the test reads ``environment``;
``ci/install.sh`` installs Debian's ``chromium`` where apt-get is available.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.report import render_html
from tests.conformance.cost_sample import cost_report

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FAMILIES = ["fsdp", "fsdp2", "model_parallel"]

COLLECT = """<script>
window.__errors = [];
window.onerror = (message) => { window.__errors.push("error: " + message); };
addEventListener("error", (e) => {
  if (e.target && e.target !== window) {
    window.__errors.push("load: " + (e.target.src || e.target.href));
  }
}, true);
for (const level of ["error", "warn"]) {
  const original = console[level];
  console[level] = (...args) => {
    window.__errors.push(level + ": " + args.join(" "));
    original.apply(console, args);
  };
}
</script>"""

MEASURE = """<script>
(() => {
  const box = (el) => {
    const r = el.getBoundingClientRect();
    return {x: r.x, y: r.y, width: r.width, height: r.height, right: r.right};
  };
  const line = (p) => ({family: p.dataset.family, points: p.points.numberOfItems, box: box(p)});
  const text = (t) => ({text: t.textContent, box: box(t)});
  const point = (p) => ({
    family: p.dataset.family, world: +p.dataset.world,
    projected: p.classList.contains("projected"), box: box(p),
  });
  const loaded = performance.getEntriesByType("resource").map((r) => r.name);
  const out = {errors: window.__errors, charts: {}, loaded: loaded};
  for (const svg of document.querySelectorAll("svg.chart")) {
    out.charts[svg.id] = {
      box: box(svg),
      series: [...svg.querySelectorAll("polyline.series")].map(line),
      projection: [...svg.querySelectorAll("polyline.projection")].map(line),
      points: [...svg.querySelectorAll(".point")].map(point),
      legend: [...svg.querySelectorAll(".legend-entry[data-family] text")].map(text),
      plain: [...svg.querySelectorAll(".plain-model line")].map(box),
      text: [...svg.querySelectorAll("text")].map(text),
    };
  }
  const pre = document.createElement("pre");
  pre.id = "measured";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def _browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(
        "environment: no chromium on PATH (ci/install.sh installs Debian's chromium where "
        "apt-get is available; or put chromium or google-chrome on PATH)"
    )


def _measure(browser: str, page: str, tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    """What the browser drew of ``page``, measured by :data:`MEASURE`, and the lines of its
    log that report the page's console."""
    head = page.index("<head>") + len("<head>")
    body = page.rindex("</body>")
    copy = tmp_path / "measured.html"
    copy.write_text(page[:head] + COLLECT + page[head:body] + MEASURE + page[body:])
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1600,1200",
         "--enable-logging=stderr", "--v=0", "--dump-dom", copy.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, re.S)
    assert found, f"{browser} exited {done.returncode}; stderr:\n{done.stderr[-3000:]}"
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return json.loads(html.unescape(found.group(1))), console


def test_the_cost_chart_renders_in_chromium_one_series_per_family(tmp_path: Path) -> None:
    browser = _browser()
    measured, console = _measure(browser, render_html(cost_report()), tmp_path)
    assert measured["errors"] == [] and console == []
    assert measured["loaded"] == []  # nothing fetched: the page needs no network
    charts = measured["charts"]
    assert set(charts) == {"cost-chart", "cost-projection"}
    for name, chart in charts.items():
        frame = chart["box"]
        assert frame["width"] > 300 and frame["height"] > 150, (name, frame)
        assert [s["family"] for s in chart["series"]] == FAMILIES, name
        for series in chart["series"]:  # drawn: four points, a box with room in it
            assert series["points"] == 4, (name, series)
            assert series["box"]["width"] > 50 and series["box"]["height"] > 20, (name, series)
        assert [e["text"].split(" ")[0] for e in chart["legend"]] == FAMILIES
        for text in chart["text"]:  # no label cut off at the chart's right edge
            assert text["box"]["right"] <= frame["right"] + 0.5, (name, text)
        assert len(chart["plain"]) == 1 and chart["plain"][0]["width"] > 300
    points = [p for p in charts["cost-chart"]["points"] if p["family"] == "fsdp"]
    heights = [p["box"]["y"] for p in sorted(points, key=lambda p: p["world"])]
    assert heights == sorted(heights) and heights[0] < heights[-1]  # fewer bytes, lower
    plain_y = charts["cost-chart"]["plain"][0]["y"]
    assert all(p["box"]["y"] > plain_y for p in points)  # every world size under the plain line
    projection = charts["cost-projection"]
    assert [s["family"] for s in projection["projection"]] == FAMILIES
    assert all(s["box"]["width"] > 200 for s in projection["projection"])  # 1 to 512 ranks
    projected = sorted((p["family"], p["world"]) for p in projection["points"] if p["projected"])
    assert projected == sorted((f, w) for f in FAMILIES for w in (8, 64, 512))
