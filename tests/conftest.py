"""Shared pytest set-up for shardcheck's own tests.

The shardcheck plugin normally loads through its ``pytest11`` entry point; when the package
is not installed (a plain checkout on PYTHONPATH) it is registered here instead.
"""

from __future__ import annotations

from importlib.metadata import entry_points


def _plugin_installed() -> bool:
    return any(ep.value == "harness.plugin" for ep in entry_points(group="pytest11"))


pytest_plugins = ["pytester"] + ([] if _plugin_installed() else ["harness.plugin"])
