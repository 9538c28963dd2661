"""The CI definitions in ci/: the workflows parse, call scripts that exist, and keep what the
nightly promises (NCCL, nightly profile, Hypothesis database artifact, reports, Lightning)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML comes with the lightning extra CI installs")

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / "ci" / "workflows").glob("*.yml"))
SCRIPTS = sorted((ROOT / "ci").glob("*.sh"))


def _steps(workflow: Path) -> list[dict[str, Any]]:
    data = yaml.safe_load(workflow.read_text())
    assert data.get("jobs"), f"{workflow.name}: no jobs"
    return [step for job in data["jobs"].values() for step in job["steps"]]


def test_both_workflows_exist() -> None:
    assert [w.name for w in WORKFLOWS] == ["every-change.yml", "nightly-gpu.yml"]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda w: w.name)
def test_workflow_steps_call_scripts_that_exist(workflow: Path) -> None:
    called = [
        name
        for step in _steps(workflow)
        for name in re.findall(r"bash (ci/[\w-]+\.sh)", step.get("run", ""))
    ]
    assert called, f"{workflow.name} calls no ci/ script"
    for name in called:
        assert (ROOT / name).is_file(), f"{workflow.name} calls {name}, which does not exist"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_scripts_are_valid_bash_and_stop_on_errors(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "set -euo pipefail" in script.read_text(), f"{script.name} must stop on errors"


def test_nightly_keeps_the_database_and_uploads_reports() -> None:
    steps = _steps(ROOT / "ci" / "workflows" / "nightly-gpu.yml")
    uploaded = [s["with"] for s in steps if "upload-artifact" in s.get("uses", "")]
    uploads = {artifact["name"]: artifact for artifact in uploaded}
    database = uploads["hypothesis-database"]
    assert database["path"].rstrip("/") == ".hypothesis"
    assert database["include-hidden-files"] is True  # .hypothesis is hidden: skipped otherwise
    assert "reports" in uploads["reports-nightly"]["path"]
    fetch = " ".join(s.get("run", "") for s in steps)
    assert "gh run download" in fetch and "hypothesis-database" in fetch
    nightly = (ROOT / "ci" / "nightly.sh").read_text()
    assert "--backend nccl" in nightly and "--hypothesis-profile=nightly" in nightly
    assert "harness.adapters.lightning:make_strategy" in nightly
    assert "ci/attach.sh" in nightly and "ci/coverage.sh" in nightly


def test_every_change_runs_the_readme_test_command() -> None:
    every = (ROOT / "ci" / "every_change.sh").read_text()
    assert "bash ci/test.sh --hypothesis-profile=ci" in every
    readme = (ROOT / "README.md").read_text()
    assert "bash ci/test.sh" in readme
