"""The CI definitions in ci/: the workflows parse, call scripts that exist, and keep what the
nightly promises (NCCL, nightly profile, Hypothesis database artifact, reports, Lightning)."""

from __future__ import annotations

import os
import re
import shutil
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
    assert "bash ci/field.sh" in nightly  # the field run against Lightning's expected failures
    assert "ci/attach.sh" in nightly and "ci/coverage.sh" in nightly
    assert "SHARDCHECK_NODES=2" in nightly  # the whole suites on two simulated nodes
    assert "bash ci/torch_matrix.sh" in nightly
    assert "SHARDCHECK_TORCH=${SHARDCHECK_TORCH:-cuda}" in nightly  # not the CPU default


def test_torch_matrix_installs_each_version_apart_and_diffs_the_reports() -> None:
    matrix = (ROOT / "ci" / "torch_matrix.sh").read_text()
    versions = "2.11.0 2.12.1 2.13.0 2.14.1"  # every supported minor release
    assert versions in matrix
    assert ".venv-torch-$version" in matrix and "bash ci/install.sh" in matrix
    assert "python -m harness.report diff" in matrix
    assert "--conformance-strict" in matrix
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", ".venv-torch-2.14.1/bin/python"], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0, ".venv-torch-* must be git-ignored"
    install = (ROOT / "docs/install.md").read_text()
    for version in versions.split():  # docs/install.md's table has a measured row for each
        assert re.search(rf"^\| {re.escape(version)} \| .* passed", install, re.M), version
    from harness.torch_compat import OLDEST

    oldest = ".".join(map(str, OLDEST))
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"torch>={oldest}"' in pyproject  # the oldest version in the matrix
    assert versions.startswith(f"{oldest}.")


def _torch_command(**env: str) -> str:
    """What ci/install.sh prints about torch in a dry run (it makes nothing)."""
    done = subprocess.run(
        ["bash", str(ROOT / "ci" / "install.sh")],
        env={"PATH": os.environ["PATH"], "SHARDCHECK_DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_install_takes_torch_from_the_cpu_index_when_it_answers(tmp_path: Path) -> None:
    index = tmp_path / "cpu-index"
    (index / "torch").mkdir(parents=True)
    out = _torch_command(TORCH_CPU_INDEX=f"file://{index}")
    assert f"pip install --quiet torch==2.13.0 --index-url file://{index}" in out
    out = _torch_command(TORCH_CPU_INDEX=f"file://{index}", SHARDCHECK_TORCH="cuda")
    assert out.strip().endswith("pip install --quiet torch==2.13.0"), out


def test_install_falls_back_to_the_plain_pin_when_the_index_does_not_answer(
    tmp_path: Path,
) -> None:
    out = _torch_command(TORCH_CPU_INDEX=f"file://{tmp_path}/missing", TORCH_VERSION="2.14.1")
    assert "does not answer: installing torch==2.14.1 as pip is configured" in out
    assert out.strip().endswith("pip install --quiet torch==2.14.1"), out


def test_install_refuses_an_unknown_torch_flavour() -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "ci" / "install.sh")],
        env={"PATH": os.environ["PATH"], "SHARDCHECK_TORCH": "rocm"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "SHARDCHECK_TORCH=rocm: use cpu (the default) or cuda" in done.stderr


def test_every_change_runs_the_readme_test_command() -> None:
    every = (ROOT / "ci" / "every_change.sh").read_text()
    assert "bash ci/test.sh --hypothesis-profile=ci" in every
    readme = (ROOT / "README.md").read_text()
    assert "bash ci/test.sh" in readme


def _browser_step(where: Path, *programs: str, **env: str) -> tuple[str, list[str]]:
    """ci/browser.sh run with only ``programs`` on PATH (fakes, made in the new directory
    ``where``: ``apt-get`` fails and records its arguments, ``sudo`` and ``env`` run their
    command, a browser does nothing): its output and the apt-get calls."""
    bin_dir = where / "bin"
    bin_dir.mkdir(parents=True)
    calls = where / "apt-calls"
    fakes = {
        "apt-get": f'#!/bin/sh\necho "$*" >> {calls}\nexit 100\n',
        "sudo": '#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n',
        "env": '#!/bin/sh\nwhile [ "${1#*=}" != "$1" ]; do shift; done\nexec "$@"\n',
        "true": "#!/bin/sh\nexit 0\n",
        "chromium": "#!/bin/sh\nexit 0\n",
    }
    for name in programs:
        (bin_dir / name).write_text(fakes[name])
        (bin_dir / name).chmod(0o755)
    done = subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(ROOT / "ci" / "browser.sh")],
        env={"PATH": str(bin_dir), **env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # it never fails the install
    return done.stdout, calls.read_text().splitlines() if calls.exists() else []


def test_install_adds_a_browser_or_says_the_browser_test_will_read_environment(
    tmp_path: Path,
) -> None:
    assert "bash ci/browser.sh" in (ROOT / "ci" / "install.sh").read_text()
    fakes = ("apt-get", "sudo", "true", "env")
    out, calls = _browser_step(tmp_path / "present", "chromium", *fakes)
    assert (out, calls) == ("", [])  # a browser on PATH: nothing to do, nothing said
    out, calls = _browser_step(tmp_path / "off", *fakes, SHARDCHECK_BROWSER="0")
    assert "SHARDCHECK_BROWSER=0" in out and calls == []
    out, _ = _browser_step(tmp_path / "bare")
    assert out == (
        "ci/install.sh: no chromium (no apt-get): the browser test of report.html will read "
        "environment\n"
    )
    out, calls = _browser_step(tmp_path / "failing", *fakes)
    assert "(apt-get install chromium failed)" in out and out.count("\n") == 1
    assert calls == ["-qq install -y chromium", "-qq update"]  # the update failed too
