"""Helpers for the conformance plugin's tests: run a small fake suite, read its report.

The fake suites need no ranks, so they run in-process (``pytester.runpytest``) without the
pool plugin (``-p no:shardcheck`` keeps an installed one from reconfiguring this session's
pools). The conformance plugin is loaded by module name; its entry-point name is blocked so
that an installed entry point does not register the module a second time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PLUGIN_ARGS = [
    "-p",
    "no:shardcheck",
    "-p",
    "no:shardcheck_conformance",
    "-p",
    "harness.conformance",
]


@dataclass
class Run:
    """One pytester run of a fake suite."""

    result: pytest.RunResult
    report_dir: Path

    @property
    def ret(self) -> int:
        """The exit status."""
        return int(self.result.ret)

    @property
    def text(self) -> str:
        """The whole terminal output."""
        return self.result.stdout.str()

    def report(self) -> dict[str, Any]:
        """The ``report.json`` document."""
        return json.loads((self.report_dir / "report.json").read_text())

    def markdown(self) -> str:
        """The ``report.md`` text."""
        return (self.report_dir / "report.md").read_text()

    def outcomes(self) -> dict[str, str]:
        """``{check id: outcome}`` from the report."""
        return {c["id"]: c["outcome"] for c in self.report()["checks"]}

    def check(self, check_id: str) -> dict[str, Any]:
        """One check's entry in the report."""
        return next(c for c in self.report()["checks"] if c["id"] == check_id)


@pytest.fixture
def run_suite(pytester: pytest.Pytester) -> Callable[..., Run]:
    """Write ``source`` as ``test_fake.py`` (unless ``files`` is given), run pytest on it.

    The run writes its report into ``<tmp>/out`` and has Hypothesis' database off.
    """

    def run(source: str | None = None, *args: str, files: dict[str, str] | None = None) -> Run:
        if source is not None:
            pytester.makepyfile(test_fake=source)
        for name, text in (files or {}).items():
            path = pytester.path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        out = pytester.path / "out"
        result = pytester.runpytest(
            *PLUGIN_ARGS,
            "-p",
            "no:cacheprovider",
            "--conformance-report",
            str(out),
            *args,
        )
        return Run(result, out)

    return run
