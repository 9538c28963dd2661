"""``report.html``: one self-contained page to open in a browser.

The verdict, the counts and the run's facts, the findings, the clauses, the coverage matrix
(clauses by configuration-axis values, :mod:`harness.report.matrix`), the cost (bytes per rank
against world size as inline SVG, :mod:`harness.report.chart`, and a table per family) and
the checks that did not pass. No network is needed: the style and the charts are inline, there
are no scripts, fonts or images.
Every text from the run goes through :func:`html.escape` (failure messages hold ``<``, ``>``
and ``&``); long lists are cut with ``... and N more`` (report.md has them whole).
"""

from __future__ import annotations

import html
from typing import Any

from harness.report.chart import cost_charts
from harness.report.cost import FOOTPRINT, categories, footprint, human_bytes
from harness.report.markdown import clause_coverage_line, coverage_line
from harness.report.matrix import COVERED, NEVER, REACHED, CoverageMatrix, coverage_matrix
from harness.report.model import NO_CLAUSE, Report, clause_family_outcomes, clause_outcomes
from harness.report.outcome import Outcome
from harness.report.verdict import verdict
from harness.report.words import shorten

__all__ = ["render_html"]

_CHECKS_SHOWN = 500  # checks that did not pass, listed
_IDS_SHOWN = 12  # check ids per clause row
_TEXT = 4000  # characters of an example or a reproducer
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1f2328}
h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px}
table{border-collapse:collapse;margin:4px 0;width:100%}.facts,.m{width:auto}
td code{overflow-wrap:anywhere}.where{color:#57606a;font-size:12px}
th,td{border:1px solid #d0d7de;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.id{white-space:nowrap}td.cl{min-width:9em;max-width:16em}
.np td:first-child{max-width:36em;overflow-wrap:anywhere}
code,pre{font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f6f8fa;padding:6px;white-space:pre-wrap;word-break:break-word;margin:4px 0}
.verdict{padding:10px 14px;border-radius:6px;font-size:16px;margin:8px 0 12px;color:#fff}
.v-passed{background:#1a7f37}.v-failed{background:#cf222e}.v-incomplete{background:#9a6700}
.o{display:inline-block;padding:0 6px;border-radius:10px;font-size:12px;color:#fff}
.o-ok{background:#1a7f37}.o-bad{background:#cf222e}.o-warn{background:#bc4c00}
.o-xf{background:#8250df}.o-idle{background:#6e7781}
.facts td:first-child{color:#57606a;white-space:nowrap}
.m{border-collapse:separate;border-spacing:1px}
.m td{width:13px;height:13px;padding:0;border:0}
.m th{font-weight:normal;font-size:11px;padding:1px 3px;border:0;background:none}
.m th.v{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;height:auto}
.m th.a{border-bottom:1px solid #8c959f;text-align:center}
.m th.c{text-align:right;white-space:nowrap}
.c-covered{background:#2da44e}.c-reached{background:#e16f24}.c-never{background:#cf222e;opacity:.55}
.c-{background:#eaeef2}
.key span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:-1px}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{max-width:100%;height:auto}
.chart text{font-size:11px;fill:#57606a}.chart .chart-title{font-size:13px;fill:#1f2328}
.chart .axis-label{font-size:12px;fill:#1f2328}.chart .legend text{fill:#1f2328}
.chart .grid{stroke:#eaeef2}.chart .axis{stroke:#8c959f}
.cost td.b{text-align:right;white-space:nowrap}.cost{width:auto;font-size:13px}
.cost td.cfg{min-width:14em}.wide{overflow-x:auto}
.cost tr.projection td{color:#57606a;font-style:italic}.cost tr.plain td{background:#f6f8fa}
"""


def _outcome_class(outcome: str) -> str:
    """The badge colour: green passed, red a failure of the check's own, amber an error or a
    block, purple expected, grey what did not run."""
    kind = Outcome(outcome)
    if kind is Outcome.PASSED:
        return "ok"
    if kind is Outcome.XFAILED:
        return "xf"
    if kind.fails_run:
        return "bad" if kind.joins_finding and kind is not Outcome.BLOCKED else "warn"
    return "idle"


_TITLES = {COVERED: ": covered", REACHED: ": not passed", NEVER: ": never reached", "": ""}
_STATE_WORDS = {
    COVERED: "covered by a passing check",
    REACHED: "reached only in checks that did not pass",
    NEVER: "in the clause's scope, never reached",
    "": "outside the clause's scope, or an axis its checks do not report",
}


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more)"


def _badge(outcome: str) -> str:
    return f'<span class="o o-{_outcome_class(outcome)}">{_e(outcome)}</span>'


def _first_line(text: str | None, limit: int = 300) -> str:
    line = next((x.strip() for x in (text or "").splitlines() if x.strip()), "")
    return shorten(line, limit)


def _more(items: list[str], shown: int) -> str:
    head = ", ".join(_e(i) for i in items[:shown])
    return head + (f" ... and {len(items) - shown} more" if len(items) > shown else "")


def _facts(report: Report) -> list[str]:
    env, run, strategy = report.environment, report.run, report.strategy
    rows: list[tuple[str, Any]] = [
        ("strategy", f"{strategy.get('factory')} {strategy.get('options', {}) or ''}"),
        ("shardcheck", f"{report.suite_version} (report schema {report.schema_version})"),
        ("torch / Python", f"{env.get('torch')} / {env.get('python')} on {env.get('platform')}"),
        ("backend / device", f"{env.get('backend')} / {env.get('device')}"),
        ("world sizes", ", ".join(str(s) for s in env.get("world_sizes", [])) or "none"),
    ]
    if run:
        seed = run.get("hypothesis_seed")
        rows += [
            (
                "Hypothesis",
                f"profile {run.get('hypothesis_profile')}, seed "
                f"{'none (--hypothesis-seed not given)' if seed is None else seed}",
            ),
            ("started (UTC)", run.get("started_at")),
            ("wall time", f"{run.get('wall_time_s')} s"),
            ("ranks restarted", _restarts(run.get("heals", []))),
        ]
    if report.selection.get("clauses") or report.selection.get("deselected"):
        rows.append(
            (
                "selection",
                f"--clauses {report.selection.get('clauses') or '(all)'}; "
                f"{len(report.selection.get('deselected', []))} checks deselected",
            )
        )
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return [f'<table class="facts">{body}</table>']


def _findings(report: Report) -> list[str]:
    if not report.findings:
        return ["<h2>Findings</h2>", "<p>None.</p>"]
    out = [
        f'<h2 id="findings">Findings ({len(report.findings)})</h2>',
        "<table><tr><th>finding</th><th>clauses</th><th>what, and where it was raised</th>"
        "<th>first check</th><th>checks</th><th>example and reproducer</th></tr>",
    ]
    for f in report.findings:
        late = " <em>(after the checks' properties: their verdicts stand)</em>" if f.late else ""
        detail = "".join(
            f"<div>{label}</div><pre>{_e(_clip(text, _TEXT))}</pre>"
            for label, text in (("example", f.example), ("reproduce", f.reproduce))
            if text
        )
        raised = f" (raised in {_e(f.raised_in)})" if f.raised_in else ""
        out.append(
            f'<tr><td class="id">{_e(f.id)}</td><td class="cl">{_e(", ".join(f.clauses))}</td>'
            f"<td><code>{_e(f.message)}</code>{late}"
            f'<div class="where">{_e(f.where)}{raised}</div></td>'
            f"<td><code>{_e(f.checks[0] if f.checks else '')}</code></td><td>{len(f.checks)}</td>"
            f"<td><details><summary>show</summary>{detail}</details></td></tr>"
        )
    return [*out, "</table>"]


def _clauses(report: Report) -> list[str]:
    table = clause_outcomes(report.checks, report.findings)
    by_family = clause_family_outcomes(report.checks, report.findings)
    families = sorted({f for row in by_family.values() for f in row})
    head = "".join(f"<th>{_e(f)}</th>" for f in families)
    out = [
        f'<h2 id="clauses">Clauses ({len([c for c in table if c != NO_CLAUSE])})</h2>',
        f"<table><tr><th>clause</th><th>outcome</th>{head}<th>checks</th><th>not passed</th></tr>",
    ]
    for clause, (outcome, members) in table.items():
        split = "".join(
            f"<td>{_badge(by_family[clause][f]) if f in by_family.get(clause, {}) else '-'}</td>"
            for f in families
        )
        bad = [
            f"{c.id} ({c.clause_outcome(clause)})"
            for c in members
            if c.clause_outcome(clause) != "passed"
        ]
        out.append(
            f'<tr><td class="id">{_e(clause)}</td><td>{_badge(outcome)}</td>{split}'
            f"<td>{len(members)}</td>"
            f"<td><code>{_more(bad, _IDS_SHOWN)}</code></td></tr>"
        )
    return [*out, "</table>"]


def _matrix_table(matrix: CoverageMatrix) -> str:
    axes = "".join(f'<th class="a" colspan="{n}">{_e(a)}</th>' for a, n in matrix.axes())
    values = "".join(f'<th class="v">{_e(v)}</th>' for _, v in matrix.columns)
    rows = []
    for clause, states in matrix.rows:
        cells = "".join(
            f'<td class="c-{s}" title="{_e(clause)} {_e(a)}={_e(v)}{_TITLES[s]}"></td>'
            for (a, v), s in zip(matrix.columns, states, strict=True)
        )
        rows.append(f'<tr><th class="c">{_e(clause)}</th>{cells}</tr>')
    return (
        f'<table class="m"><tr><th></th>{axes}</tr><tr><th></th>{values}</tr>'
        + "".join(rows)
        + "</table>"
    )


def _coverage(report: Report) -> list[str]:
    out = ['<h2 id="coverage">Configuration coverage</h2>']
    matrix = coverage_matrix(report.coverage)
    if not report.coverage or matrix is None:
        return [*out, "<p>No job of this run reported its configuration axes.</p>"]
    out += [
        f"<p>{_e(coverage_line(report.coverage))}.<br>"
        f"{_e(clause_coverage_line(report.coverage))}.</p>"
    ]
    key = "".join(f'<span class="c-{s}"></span>{_e(w)}' for s, w in _STATE_WORDS.items())
    return [*out, f'<p class="key">{key}</p>', _matrix_table(matrix)]


def _bytes_cell(value: int | None) -> str:
    if value is None:
        return "<td></td>"
    return f'<td class="b" title="{value} bytes">{_e(human_bytes(value))}</td>'


def _cost_table(name: str, family: dict[str, Any]) -> list[str]:
    """One family's table: the plain model, each measured world size (at rest and peak by
    category, collectives of the step by kind) and the projection's rows, marked."""
    series = family.get("series", [])
    plain = family.get("plain", {})
    rest = categories([p["at_rest"] for p in series] + [{k: plain.get(k, 0) for k in FOOTPRINT}])
    peak = categories(p["peak"] for p in series)
    kinds = list(dict.fromkeys(k for p in series for k in p["collectives"]))
    head = (
        f'<table class="cost" data-family="{_e(name)}"><tr><th rowspan="2">world size</th>'
        '<th rowspan="2">configuration</th>'
        f'<th colspan="{len(rest)}">at rest, after the step (largest rank)</th>'
        f'<th colspan="{len(peak)}">peak of the step (largest rank)</th>'
        f'<th colspan="{max(len(kinds), 1)}">collectives per step: count, bytes</th></tr><tr>'
        + "".join(f"<th>{_e(c)}</th>" for c in rest)
        + "".join(f"<th>{_e(c)}</th>" for c in peak)
        + ("".join(f"<th>{_e(k)}</th>" for k in kinds) or "<th>kind</th>")
        + "</tr>"
    )
    rows = [head]
    if plain:
        cells = "".join(
            _bytes_cell(
                footprint(plain) if c == "total" else plain.get(c, 0) if c in FOOTPRINT else None
            )
            for c in rest
        )
        rows.append(
            '<tr class="plain"><td>-</td><td class="cfg">plain model: params + grads + '
            f"optimizer, one process</td>{cells}"
            f'<td colspan="{len(peak) + max(len(kinds), 1)}"></td></tr>'
        )
    for point in series:
        counted = point["collectives"]
        rows.append(
            f'<tr class="measured"><td>{point["world_size"]}</td>'
            f'<td class="cfg">{_e(point["configuration"])}</td>'
            + "".join(_bytes_cell(point["at_rest"].get(c, 0)) for c in rest)
            + "".join(_bytes_cell(point["peak"].get(c, 0)) for c in peak)
            + (
                "".join(
                    f'<td class="b">{counted[k]["count"]}, {_e(human_bytes(counted[k]["bytes"]))}'
                    "</td>"
                    if k in counted
                    else "<td>-</td>"
                    for k in kinds
                )
                or "<td>none</td>"
            )
            + "</tr>"
        )
    projection = family.get("projection", {})
    for world, total in projection.get("at", {}).items():
        rows.append(
            f'<tr class="projection"><td>{_e(world)} (projected)</td>'
            '<td class="cfg">projection: fixed + sharded / world, not measured</td>'
            f'<td colspan="{len(rest) - 1}"></td>{_bytes_cell(total)}'
            f'<td colspan="{len(peak) + max(len(kinds), 1)}"></td></tr>'
        )
    return [*rows, "</table>"]


def _cost(report: Report) -> list[str]:
    families = report.cost.get("families", {}) if report.cost else {}
    if not families:
        return []
    out = [
        '<h2 id="cost">Cost</h2>',
        "<p>Bytes per rank at rest after the optimizer step (the largest rank), by world size, "
        "for each family's main configuration; the dashed line is the plain model's params, "
        "grads and optimizer state in one process. The projection fits "
        "<code>bytes = fixed + sharded / world</code> to the measured sizes: it is not a "
        "measurement.</p>",
        f'<div class="charts">{"".join(cost_charts(report.cost))}</div>',
    ]
    for name, family in families.items():
        law = family.get("projection", {})
        fitted = (
            f" Projection: {_e(human_bytes(law['fixed']))} fixed + "
            f"{_e(human_bytes(law['sharded']))} / world, fitted to world sizes "
            f"{_e(', '.join(str(w) for w in law.get('measured_worlds', [])))}."
            if law
            else " No projection: fewer than two world sizes were measured."
        )
        table = "".join(_cost_table(name, family))
        out += [f"<h3>{_e(name)}</h3>", f"<p>{fitted}</p>", f'<div class="wide">{table}</div>']
    count = len(report.cost.get("configurations", []))
    out.append(
        f"<p>{count} configurations measured; report.md lists each, with every rank's bytes "
        "and the collectives of each phase (report.json: <code>cost</code>).</p>"
    )
    return out


def _not_passed(report: Report) -> list[str]:
    checks = [c for c in report.checks if c.outcome != "passed"]
    if not checks:
        return []
    out = [
        f"<h2>Checks that did not pass ({len(checks)})</h2>",
        '<table class="np"><tr><th>check</th><th>outcome</th><th>finding</th><th>why</th></tr>',
    ]
    for c in checks[:_CHECKS_SHOWN]:
        out.append(
            f"<tr><td><code>{_e(c.id)}</code></td><td>{_badge(c.outcome)}</td>"
            f"<td>{_e(c.finding or '')}</td><td><code>{_e(_first_line(c.failure))}</code></td></tr>"
        )
    out.append("</table>")
    if len(checks) > _CHECKS_SHOWN:
        out.append(f"<p>... and {len(checks) - _CHECKS_SHOWN} more (report.md lists them).</p>")
    return out


def render_html(report: Report) -> str:
    """``report.html`` for ``report``: a whole page, with no external resource."""
    decided = verdict(report)
    counts = " ".join(f"{_badge(o)} {n}" for o, n in report.counts().items() if n) or "no checks"
    body = [
        "<h1>shardcheck conformance report</h1>",
        f'<div class="verdict v-{_e(decided.word)}"><b>{_e(decided.word.upper())}</b>: '
        f"{_e(decided.sentence)}</div>",
        f"<p>{counts} ({len(report.checks)} checks)</p>",
        *_facts(report),
        *_findings(report),
        *_clauses(report),
        *_coverage(report),
        *_cost(report),
        *_not_passed(report),
        "<p>Every failure with its reproducer: report.md; for tools: report.json.</p>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>shardcheck conformance report</title>"
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _restarts(heals: list[dict[str, object]]) -> str:
    """``0``, or ``2: world size 2 crash in test_x; ...`` (see [Note: heals are counted])."""
    if not heals:
        return "0"
    listed = "; ".join(f"world size {h['world_size']} {h['cause']} in {h['check']}" for h in heals)
    return f"{len(heals)}: {listed}"
