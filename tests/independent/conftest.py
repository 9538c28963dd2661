"""The ``nightly`` marker of the independent strategies' slow runs.

A test marked ``@pytest.mark.nightly`` runs the suites in a subprocess for a minute or more;
it runs only when ``SHARDCHECK_NIGHTLY=1`` (``ci/nightly.sh`` sets it), so the every-change
job stays inside its time.
"""

from __future__ import annotations

import os

import pytest

NIGHTLY = os.environ.get("SHARDCHECK_NIGHTLY") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "nightly: a slow run of the suites; runs only with SHARDCHECK_NIGHTLY=1"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if NIGHTLY:
        return
    skip = pytest.mark.skip(reason="nightly only: set SHARDCHECK_NIGHTLY=1 to run it")
    for item in items:
        if item.get_closest_marker("nightly") is not None:
            item.add_marker(skip)
