"""Write docs/results.md: every measured figure the project quotes, each with the command,
machine, torch and commit that produced it.

The figures come from files runs wrote, never from hand-typed numbers:

- conformance runs: the ``report.json`` a ``--conformance-report DIR`` run wrote (its ``run``
  section holds the command, shardcheck's commit and the machine; ``environment`` the torch);
  a run whose cost checks ran (``cost``) also gets a row per family in the cost section: the
  bytes per rank at rest and at the step's peak per world size, the plain model's, and the
  projection to 8, 64 and 512 ranks;
- the pool benchmark: the file ``python -m harness.bench --json FILE`` wrote.

Usage (from the repository root)::

    python ci/results.py reference=reports/reference --bench pool=bench.json
    python ci/results.py reports/reference lightning=reports/field-lightning --out docs/results.md

Each positional argument is ``[LABEL=]REPORT_DIR`` (the label defaults to the directory's
name); ``--bench [LABEL=]FILE`` may be repeated. Facts a file does not hold (a report written
before they were recorded) read ``not recorded``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs/results.md"
UNKNOWN = "not recorded"
#: the benchmark's figures worth a row: key, what it is, unit
BENCH_ROWS = (
    ("pool_start_cold_s", "pool start, 4 ranks, cold (forkserver + join + warm-up)", "s"),
    ("respawn_s", "respawn after a kill, 4 ranks", "s"),
    ("empty_job_ms_ws1", "empty job round trip, world size 1 (median)", "ms"),
    ("empty_job_ms_ws2", "empty job round trip, world size 2 (median)", "ms"),
    ("empty_job_ms_ws4", "empty job round trip, world size 4 (median)", "ms"),
    ("fsdp_overhead_ms", "tiny FSDP2 job: pool overhead over in-rank time (median)", "ms"),
    ("spawn_ratio", "tiny FSDP2 job: spawning 4 processes / through the pool", "x"),
    ("rss_growth_mb", "RSS growth per rank over the soak runs (max)", "MB"),
)


@dataclass(frozen=True)
class Source:
    """One input: its label and its path."""

    label: str
    path: Path


def parse_source(text: str) -> Source:
    """``LABEL=PATH`` or ``PATH`` (labelled by the path's name)."""
    label, sep, path = text.partition("=")
    if not sep:
        label, path = Path(text).name or text, text
    if not label or not path:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not LABEL=PATH or PATH; e.g. reference=reports/reference"
        )
    return Source(label, Path(path))


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"error: {what} {str(path)!r} does not exist; {_HINTS[what]}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"error: {what} {str(path)!r} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SystemExit(f"error: {what} {str(path)!r} holds no JSON object")
    return data


_HINTS = {
    "report": "pass a directory a --conformance-report DIR run wrote (it holds report.json)",
    "benchmark": "pass the file python -m harness.bench --json FILE wrote",
}


def _cell(value: Any) -> str:
    text = UNKNOWN if value in (None, "") else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _machine(facts: dict[str, Any], device: str | None = None) -> str:
    machine = facts.get("machine")
    if not isinstance(machine, dict):
        return UNKNOWN
    text = (
        f"{machine.get('cpus', '?')} CPUs ({machine.get('cpu', '?')}, {machine.get('arch', '?')})"
    )
    return f"{text}, {device}" if device else text


def _commit(facts: dict[str, Any]) -> str:
    value = facts.get("commit")
    if not value:
        return UNKNOWN
    head, _, dirty = str(value).partition("+")
    return f"`{head[:12]}`" + (" with uncommitted changes" if dirty else "")


def _clause_outcomes(path: Path) -> dict[str, str]:
    """Each clause's outcome from the report's checks, by the rules of the shardcheck in use
    (a report written by an older one may have recorded others)."""
    from harness.report import NO_CLAUSE, ReportError, clause_outcomes, load_report

    try:
        report = load_report(path)
    except ReportError as exc:
        raise SystemExit(f"error: {exc}") from None
    table = clause_outcomes(report.checks, report.findings)
    return {clause: outcome for clause, (outcome, _) in table.items() if clause != NO_CLAUSE}


def _resources(run: dict[str, Any], figure: str) -> str:
    """Per world size, the busiest rank's ``figure`` after its first and last job and its
    peak (``run.resources``, see docs/rank-resources.md)."""
    resources = run.get("resources")
    if not isinstance(resources, dict) or not resources:
        return UNKNOWN
    parts = []
    for size, pool in sorted(resources.items(), key=lambda kv: int(kv[0])):
        ranks = [r[figure] for r in pool.get("ranks", {}).values() if figure in r]
        if not ranks:
            continue
        first, last, peak = (max(r[k] for r in ranks) for k in ("first", "last", "peak"))
        recycled = len(pool.get("recycles", []))
        note = f", recycled {recycled}x" if recycled else ""
        parts.append(f"world size {size}: {first:g} -> {last:g} ({peak:g}{note})")
    return "; ".join(parts) or UNKNOWN


def _moved(run: dict[str, Any]) -> str:
    moved = run.get("cutoffs_moved")
    if not isinstance(moved, dict):
        return UNKNOWN
    return str(sum(len(reasons) for reasons in moved.values()))


def report_section(source: Source) -> list[str]:
    """The lines for one conformance run."""
    data = _read_json(source.path / "report.json", "report")
    run, env = data.get("run", {}), data.get("environment", {})
    counts = data.get("counts", {})
    outcomes = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or "no checks"
    clauses = _clause_outcomes(source.path / "report.json")
    passed = sum(outcome == "passed" for outcome in clauses.values())
    wall = run.get("wall_time_s")
    rows = [
        ("command", f"`{run['command']}`" if run.get("command") else UNKNOWN),
        ("strategy", f"`{data.get('strategy', {}).get('factory', UNKNOWN)}`"),
        ("checks", f"{outcomes} ({sum(counts.values())} checks)"),
        ("clauses passed", f"{passed} of {len(clauses)} (by this shardcheck's rules)"),
        ("findings", len(data.get("findings", []))),
        ("wall time", f"{wall} s" if wall is not None else UNKNOWN),
        ("restarts of the ranks", len(run.get("heals", []))),
        ("rank threads, first -> last job (peak)", _resources(run, "threads")),
        ("rank memory, MiB, first -> last job (peak)", _resources(run, "rss_mib")),
        ("job cutoffs moved on while ranks worked", _moved(run)),
        ("Hypothesis profile", run.get("hypothesis_profile")),
        ("torch", env.get("torch")),
        ("backend", env.get("backend")),
        ("machine", _machine(run, env.get("device"))),
        ("commit", _commit(run)),
        ("started (UTC)", run.get("started_at")),
        ("report", f"`{source.path}`"),
    ]
    return [
        f"### {source.label}",
        "",
        "| | |",
        "|---|---|",
        *(f"| {name} | {_cell(value)} |" for name, value in rows),
        "",
    ]


def _facts_line(command: Any, torch: Any, run: dict[str, Any], device: Any = None) -> str:
    return (
        f"Command `{command or UNKNOWN}`; torch {_cell(torch)}; machine "
        f"{_machine(run, device)}; commit {_commit(run)}."
    )


def cost_section(source: Source) -> list[str]:
    """The lines for one conformance run's cost (none when its cost checks did not run)."""
    from harness.report.cost import PROJECTED_WORLDS, footprint, human_bytes

    data = _read_json(source.path / "report.json", "report")
    families = (data.get("cost") or {}).get("families", {})
    if not families:
        return []
    run, env = data.get("run", {}), data.get("environment", {})
    worlds = sorted({p["world_size"] for f in families.values() for p in f.get("series", [])})
    heads = ["plain model", *(f"world {w}" for w in worlds)]
    heads += [f"{w} (projected)" for w in PROJECTED_WORLDS]
    lines = [
        f"### {source.label}",
        "",
        _facts_line(run.get("command"), env.get("torch"), run, env.get("device")),
        "",
        "| family | bytes per rank | " + " | ".join(heads) + " |",
        "|---|---|" + "---:|" * len(heads),
    ]
    laws = []
    for name, family in families.items():
        series = {p["world_size"]: p for p in family.get("series", [])}
        law = family.get("projection") or {}
        plain = family.get("plain")
        for what, key in (("at rest", "at_rest"), ("peak of the step", "peak")):
            cells = [human_bytes(footprint(plain)) if plain and key == "at_rest" else "-"]
            cells += [
                human_bytes(series[w][key].get("total", 0)) if w in series else "-" for w in worlds
            ]
            cells += [
                human_bytes(law["at"][str(w)]) if key == "at_rest" and law else "-"
                for w in PROJECTED_WORLDS
            ]
            lines.append(f"| {name} | {what} | " + " | ".join(cells) + " |")
        if law:
            measured = ", ".join(str(w) for w in law.get("measured_worlds", []))
            laws.append(
                f"{name} {human_bytes(law['fixed'])} + {human_bytes(law['sharded'])} / world "
                f"(fitted to world sizes {measured})"
            )
    lines += [
        "",
        "The largest rank of each family's main configuration; at rest is after the optimizer "
        "step; the plain model's is its params + grads + optimizer in one process. Projected "
        "figures are not measured: `fixed + sharded / world` by least squares: "
        + ("; ".join(laws) or "none fitted")
        + ".",
        "",
    ]
    return lines


def bench_section(source: Source) -> list[str]:
    """The lines for one benchmark run."""
    figures = _read_json(source.path, "benchmark")
    run = figures.get("run", {})
    lines = [
        f"### {source.label}",
        "",
        _facts_line(run.get("command"), run.get("torch"), run),
        "",
        "| figure | value |",
        "|---|---|",
    ]
    for key, what, unit in BENCH_ROWS:
        if key in figures:
            lines.append(f"| {what} | {figures[key]:.3g} {unit} |")
    return [*lines, ""]


def render(reports: Sequence[Source], benches: Sequence[Source]) -> str:
    """docs/results.md for these inputs."""
    inputs = " ".join(f"{s.label}={s.path}" for s in reports)
    inputs += "".join(f" --bench {s.label}={s.path}" for s in benches)
    lines = [
        "# Measured results",
        "",
        "Written by `ci/results.py` from the files the runs below wrote; do not edit by hand,",
        "rerun it:",
        "",
        "```bash",
        f"python ci/results.py {inputs.strip()}",
        "```",
        "",
        "Each figure names the command that produced it, the machine, torch and shardcheck's",
        "commit. Times on a shared or small machine vary from run to run: read them as orders",
        "of magnitude, not promises.",
        "",
    ]
    if reports:
        lines += ["## Conformance runs", ""]
        for source in reports:
            lines += report_section(source)
    costs = [line for source in reports for line in cost_section(source)]
    if costs:
        lines += ["## Cost per rank", "", *costs]
    if benches:
        lines += ["## Pool benchmark", ""]
        for source in benches:
            lines += bench_section(source)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python ci/results.py",
        description="Write docs/results.md from conformance reports and benchmark output.",
    )
    parser.add_argument(
        "reports", nargs="*", type=parse_source, help="[LABEL=]DIR holding a report.json"
    )
    parser.add_argument(
        "--bench", action="append", default=[], type=parse_source, help="[LABEL=]FILE"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="default docs/results.md")
    args = parser.parse_args(argv)
    if not args.reports and not args.bench:
        parser.error("pass at least one report directory or --bench file")
    args.out.write_text(render(args.reports, args.bench))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
