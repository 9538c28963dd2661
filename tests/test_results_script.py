"""``ci/results.py`` writes docs/results.md from report.json files and benchmark output: each
figure with its command, machine, torch and commit, each run under its label."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from harness.report import CheckResult, Report
from harness.report.cost import cost_of
from tests.conformance.cost_sample import measurements

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_results", ROOT / "ci" / "results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _report_dir(tmp_path: Path, name: str, run: dict[str, object]) -> Path:
    checks = [
        CheckResult("t.test_a", ["API-1"], "passed"),
        CheckResult("t.test_b", ["API-2"], "environment", failure="environment: no GPU"),
    ]
    report = Report("0.1.0", {"torch": "2.13.0+cpu", "backend": "gloo", "device": "cpu"},
                    {"factory": "reference_impl:make_strategy", "options": {}}, checks,
                    run=run)  # fmt: skip
    directory = tmp_path / name
    directory.mkdir()
    (directory / "report.json").write_text(json.dumps(report.to_dict()))
    return directory


def test_each_run_is_labelled_with_its_command_machine_torch_and_commit(tmp_path: Path) -> None:
    facts = {
        "command": "pytest suites/ --nproc 4 --hypothesis-profile=ci",
        "commit": COMMIT + "+dirty",
        "machine": {"cpu": "Some CPU", "cpus": 2, "arch": "x86_64"},
        "wall_time_s": 123.4,
        "hypothesis_profile": "ci",
    }
    new = _report_dir(tmp_path, "new", facts)
    old = _report_dir(tmp_path, "old", {"wall_time_s": 99.0})  # written before the facts
    bench = tmp_path / "bench.json"
    bench.write_text(
        json.dumps(
            {
                "empty_job_ms_ws4": 1.25,
                "spawn_ratio": 40.0,
                "run": {"command": "python -m harness.bench --json b.json", "torch": "2.13.0",
                        "commit": COMMIT, "machine": {"cpu": "Some CPU", "cpus": 2, "arch": "x"}},
            }
        )
    )  # fmt: skip
    out = tmp_path / "results.txt"
    script = _script()
    assert (
        script.main([f"reference={new}", str(old), "--bench", f"pool={bench}", "--out", str(out)])
        == 0
    )
    text = out.read_text()
    reference = text[text.index("### reference") : text.index("### old")]
    assert "| command | `pytest suites/ --nproc 4 --hypothesis-profile=ci` |" in reference
    assert "| torch | 2.13.0+cpu |" in reference
    assert "| machine | 2 CPUs (Some CPU, x86_64), cpu |" in reference
    assert "| commit | `0123456789ab` with uncommitted changes |" in reference
    assert "| wall time | 123.4 s |" in reference
    assert "| checks | 1 passed, 1 environment (2 checks) |" in reference
    assert "| clauses passed | 1 of 2 (by this shardcheck's rules) |" in reference
    older = text[text.index("### old") : text.index("## Pool benchmark")]
    assert "| command | not recorded |" in older and "| commit | not recorded |" in older
    pool = text[text.index("### pool") :]
    assert "Command `python -m harness.bench --json b.json`; torch 2.13.0" in pool
    assert "| empty job round trip, world size 4 (median) | 1.25 ms |" in pool


def test_a_missing_report_names_the_path_and_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"report '.*nowhere/report.json' does not exist; pass"):
        _script().main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "out.txt")])


def test_a_source_without_a_label_takes_the_directory_name() -> None:
    source = _script().parse_source("reports/reference")
    assert (source.label, source.path) == ("reference", Path("reports/reference"))


def test_rank_resources_and_moved_cutoffs_have_rows(tmp_path: Path) -> None:
    def figures(first: float, last: float, peak: float) -> dict[str, float]:
        return {"first": first, "last": last, "peak": peak}

    ranks = {
        str(r): {"threads": figures(9, 30 + r, 51), "rss_mib": figures(280.5, 300.0, 310.0),
                 "open_files": figures(20, 40, 90), "jobs": 81}
        for r in range(4)
    }  # fmt: skip
    recycles = [{"ranks": [0, 1, 2, 3], "over": "threads"}]
    run = {
        "resources": {"4": {"ranks": ranks, "recycles": recycles}},
        "cutoffs_moved": {"4": ["rank 0 used 0.50 s of CPU in 2.0 s"], "2": []},
    }
    text = _script().render([_script().Source("busy", _report_dir(tmp_path, "r", run))], [])
    threads = "world size 4: 9 -> 33 (51, recycled 1x)"
    memory = "world size 4: 280.5 -> 300 (310, recycled 1x)"
    assert f"| rank threads, first -> last job (peak) | {threads} |" in text
    assert f"| rank memory, MiB, first -> last job (peak) | {memory} |" in text
    assert "| job cutoffs moved on while ranks worked | 1 |" in text


def test_a_run_with_cost_gets_its_bytes_per_rank_with_its_facts(tmp_path: Path) -> None:
    facts = {
        "command": "pytest suites/test_cost.py --nproc 4 --hypothesis-profile=ci",
        "commit": COMMIT,
        "machine": {"cpu": "Some CPU", "cpus": 2, "arch": "x86_64"},
    }
    measured = _report_dir(tmp_path, "cost", facts)
    document = json.loads((measured / "report.json").read_text())
    document["cost"] = cost_of(measurements())
    (measured / "report.json").write_text(json.dumps(document))
    plain = _report_dir(tmp_path, "plain", facts)  # no cost checks ran: no cost rows
    script = _script()
    text = script.render([script.Source("cost", measured), script.Source("plain", plain)], [])
    cost = text[text.index("## Cost per rank") :]
    assert "### plain" not in cost and cost.startswith("## Cost per rank\n\n### cost\n")
    assert (
        "Command `pytest suites/test_cost.py --nproc 4 --hypothesis-profile=ci`; torch "
        "2.13.0+cpu; machine 2 CPUs (Some CPU, x86_64), cpu; commit `0123456789ab`." in cost
    )
    assert (
        "| family | bytes per rank | plain model | world 1 | world 2 | world 3 | world 4 "
        "| 8 (projected) | 64 (projected) | 512 (projected) |" in cost
    )
    rest = next(line for line in cost.splitlines() if line.startswith("| fsdp | at rest |"))
    assert rest.startswith("| fsdp | at rest | 553 KiB | 415 KiB | 207 KiB | 138 KiB | 104 KiB |")
    assert len(rest.split("|")) == 12  # 10 columns of figures, projected ones filled
    peak = next(line for line in cost.splitlines() if line.startswith("| fsdp | peak"))
    assert peak.endswith("| - | - | - |")  # a peak is not projected
    assert "Projected figures are not measured" in cost and "fsdp 0 B + 415 KiB / world" in cost
    assert _script().cost_section(script.Source("plain", plain)) == []
