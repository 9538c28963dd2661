"""Shared pytest set-up for shardcheck's own tests.

The shardcheck plugin normally loads through its ``pytest11`` entry point; when the package
is not installed (a plain checkout on PYTHONPATH) it is registered here instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from importlib.metadata import entry_points

import pytest


def _plugin_installed() -> bool:
    return any(ep.value == "harness.plugin" for ep in entry_points(group="pytest11"))


pytest_plugins = ["pytester"] + ([] if _plugin_installed() else ["harness.plugin"])


@pytest.fixture(autouse=True)
def _no_desync_carried_over() -> Iterator[None]:
    """Each test starts with a harness session that has seen no desync: after one, every job
    of the session runs with collective checking (``harness.run.jobs``), which would change
    what later tests of the default settings see. Nothing is imported for tests that did
    not load the harness."""
    yield
    session_module = sys.modules.get("harness.run.session")
    for session in getattr(session_module, "_ACTIVE", ()):
        session.desync_seen = False
