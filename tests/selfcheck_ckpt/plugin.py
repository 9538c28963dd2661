"""A pytest plugin for the self-check's inner runs (loaded with ``-p selfcheck_ckpt.plugin``).

- Registers the Hypothesis profile ``selfcheck``: the ``ci`` profile's settings without the
  shrink phase. A broken strategy is caught by the first failing example; shrinking it would
  cost one job per attempt and tell the self-check nothing more.
- With ``SELFCHECK_CLAUSE_DUMP=FILE`` in the environment, writes every collected test's
  ``clause`` marks to FILE as JSON (``{nodeid: [clause, ...]}``), for the coverage test.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "selfcheck",
    max_examples=10,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Dump the clause marks when asked to."""
    target = os.environ.get("SELFCHECK_CLAUSE_DUMP")
    if not target:
        return
    marks = {
        item.nodeid: sorted({c for m in item.iter_markers("clause") for c in m.args})
        for item in items
    }
    with open(target, "w") as handle:
        json.dump(marks, handle)
