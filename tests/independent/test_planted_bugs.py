"""Each bug planted in the independent strategies is one finding, under the clause whose
method broke, with no other clause of its checks failed (they read blocked, or passed in
other checks) and a headline that says what differs.

Each case runs the checkpoint suites in a subprocess on the bug's clauses (ci profile, four
ranks) and reads the run's report.json. Two cases run in every change (the wrong value in a
save, judged in the file as written before any load reads it, about 30 s, and the refusal on
rank 0 only, about 20 s, on two cores); the eight others are ``nightly``
(``SHARDCHECK_NIGHTLY=1``): together the ten take about seven minutes, and what they buy
is that a change to the triage that splits, misfiles or empties the finding of any of the
ten kinds of bug is caught within a night.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from selfcheck_ckpt.run_suites import run_suites

from independent.planted import BUGS


@dataclass(frozen=True)
class Expected:
    """What the run against one planted bug must report.

    Args:
        words: words the finding's headline holds, in its first 160 characters.
        findings: how many findings (0: the bug is a refusal, reported ``unsupported``).
        nightly: the case runs only in the nightly job.
        where: words the finding's ``where`` holds: for an error raised in torch's code,
            the strategy's own line that called torch (torch's frame is ``raised_in``).
    """

    words: tuple[str, ...]
    findings: int = 1
    nightly: bool = True
    where: str = ""


EXPECTED = {
    "local_shard_optimizer": Expected(
        (
            "CKPT-RT-1: the full checkpoint as written holds optimizer['state'][",
            ": shape (",
            ") where the plain optimizer holds shape (",
        ),
        nightly=False,
    ),
    # the sharded twin, judged from the directory by torch's offline reader
    "local_shards_in_sharded": Expected(
        (
            "CKPT-RT-2: the sharded checkpoint as written holds model[",
            ": shape (",
            ") where the plain model holds shape (",
        ),
    ),
    # the file was read and found right before the load raised: the headline says so first
    "bare_assert_in_load": Expected(
        (
            "checkpoint as written matches the plain model",
            "; the load raised AssertionError with an empty message",
        ),
        where="_check_world",
    ),
    "leftover_scratch": Expected(("the directory held", "ckpt.tmp-")),
    "load_leaves_plain_state": Expected(("mixed torch.Tensor and DTensor",)),
    "unsupported_from_method": Expected((), findings=0),
    "returns_before_written": Expected(("neither a checkpoint file",)),
    "barrier_on_rank_zero": Expected(("BARRIER",), where="independent/"),
    "refuses_on_rank_zero": Expected(("refusing to replace it with a directory",), nightly=False),
    "shape_error_in_save": Expected(("stack expects each tensor to be equal size",)),
}


#: a clause's outcomes that say its own method broke (not ``blocked`` by another's)
FAILING = ("failed", "desync", "hang")


def _cases() -> list[Any]:
    return [
        pytest.param(bug, marks=[pytest.mark.nightly] if EXPECTED[bug].nightly else [])
        for bug in BUGS
    ]


def _run(bug: str, report_dir: Path) -> dict[str, Any]:
    clauses, _ = BUGS[bug]
    args = [
        *("--strategy", f"independent.planted:{bug}", "--clauses", clauses),
        *("--nproc", "4", "--backend", "gloo", "--hypothesis-profile=ci", "-q"),
        *("--conformance-report", str(report_dir)),
    ]
    result = run_suites(args, timeout=420)
    tail = (result.stdout + result.stderr)[-3000:]
    assert (report_dir / "report.json").is_file(), f"{bug}: no report.json\n{tail}"
    report: dict[str, Any] = json.loads((report_dir / "report.json").read_text())
    report["_tail"] = tail
    return report


@pytest.mark.timeout(480)
@pytest.mark.parametrize("bug", _cases())
def test_a_planted_bug_is_one_finding_under_its_clause(bug: str, tmp_path: Path) -> None:
    _, accepted = BUGS[bug]
    expected = EXPECTED[bug]
    report = _run(bug, tmp_path)
    tail = report["_tail"]
    findings = [f for f in report["findings"] if not f["late"]]
    listed = [(f["id"], f["clauses"], f["message"][:200]) for f in findings]
    assert len(findings) == expected.findings, f"{bug}: findings {listed}\n{tail}"
    if expected.findings == 0:
        assert report["clauses"][accepted] == "unsupported", f"{bug}: {report['clauses']}"
        assert report["counts"]["failed"] == 0, f"{bug}: {report['counts']}\n{tail}"
        return
    finding = findings[0]
    assert len(finding["clauses"]) == 1, f"{bug}: {listed}"
    clause = finding["clauses"][0]
    assert clause in accepted.split("|"), f"{bug}: filed under {clause}, not {accepted}: {listed}"
    assert report["clauses"][clause] in FAILING, f"{bug}: {report['clauses']}"
    headline = finding["message"][:160]
    for word in expected.words:
        assert word in headline, f"{bug}: {word!r} is not in the headline {headline!r}"
    assert expected.where in finding["where"], (
        f"{bug}: cited at {finding['where']!r} (raised in {finding.get('raised_in')!r}), "
        f"not at a line of {expected.where!r}"
    )
    mine = [c for c in report["checks"] if c.get("finding") == finding["id"]]
    others = {c for check in mine for c in check["clauses"]} - {clause}
    wrongly = {c: report["clauses"][c] for c in others if report["clauses"][c] in FAILING}
    assert not wrongly, f"{bug}: clauses of its checks read failed: {wrongly}"
