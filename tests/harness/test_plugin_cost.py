"""The plugins cost nothing in a pytest run that does not use shardcheck, and start the
harness in one that does ([Note: the plugins' cost] in harness.entry.inplay).

Each case runs pytest in a subprocess with the plugins loaded by their entry points (as in
any pytest run of an environment where shardcheck is installed), in a directory outside this
project; a conftest that imports nothing of shardcheck writes what the run imported and which
plugins it registered.
"""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import pytest

from harness.entry import inplay

INSTALLED = {ep.value for ep in entry_points(group="pytest11")} >= {
    "harness.plugin",
    "harness.conformance",
    "harness.rankcoverage.plugin",
}
pytestmark = pytest.mark.skipif(
    not INSTALLED, reason="needs shardcheck installed (its pytest11 entry points)"
)

RECORDER = """
import json, os, sys

def pytest_unconfigure(config):
    names = ("shardcheck-session", "shardcheck-conformance-session")
    record = {
        "heavy": [m for m in ("torch", "numpy", "hypothesis", "coverage") if m in sys.modules],
        "harness": sorted(m for m in sys.modules if m == "harness" or m.startswith("harness.")),
        "plugins": [n for n in names if config.pluginmanager.has_plugin(n)],
    }
    with open(os.environ["RECORD_FILE"], "w") as f:
        json.dump(record, f)
"""


@pytest.fixture
def record(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Run pytest in a subprocess; what the run imported and registered."""
    for var in inplay.ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    out = pytester.path / "record.json"
    monkeypatch.setenv("RECORD_FILE", str(out))
    pytester.makeconftest(RECORDER)

    def run(source: str, *args: str) -> tuple[pytest.RunResult, dict]:
        pytester.makepyfile(test_it=source)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=240)
        return result, json.loads(out.read_text())

    return run


BLOCKED = ["-p", "no:shardcheck", "-p", "no:shardcheck_conformance", "-p", "no:shardcheck_coverage"]


def test_an_unrelated_run_imports_no_torch_and_starts_nothing(record) -> None:
    result, seen = record("def test_x():\n    pass\n")
    result.assert_outcomes(passed=1)
    _, without = record("def test_x():\n    pass\n", *BLOCKED)
    assert "torch" not in seen["heavy"]
    assert seen["heavy"] == without["heavy"]  # (Hypothesis' own plugin imports hypothesis)
    assert not [m for m in seen["harness"] if not inplay._light(m)], seen["harness"]
    assert seen["plugins"] == []
    assert "shardcheck:" not in result.stdout.str()  # no header line either


@pytest.mark.parametrize(
    ("source", "args"),
    [
        ("from harness import world_sizes\n\ndef test_x():\n    pass\n", []),
        ("def test_x():\n    pass\n", ["--nproc", "2"]),
        ("import pytest\n\n@pytest.mark.clause('CLIP-1')\ndef test_x():\n    pass\n", []),
    ],
    ids=["module-imports-harness", "option-given", "clause-marker"],
)
def test_a_run_that_uses_shardcheck_gets_the_harness(record, source: str, args: list[str]) -> None:
    result, seen = record(source, "--co", *args)  # collect only: no rank starts
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert "torch" in seen["heavy"] and "hypothesis" in seen["heavy"]
    assert seen["plugins"] == ["shardcheck-session", "shardcheck-conformance-session"]
