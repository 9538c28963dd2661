"""The ``selfcheck`` Hypothesis profile: ``ci`` that stops at the first failing example.

The self-check only needs to know that a broken strategy fails its clause's test; shrinking
the failing example (each step a multi-rank job) and explaining it would take minutes and
write patch files. Load this module with ``-p tests.selfcheck.profile`` and select the
profile with ``--hypothesis-profile=selfcheck``.
"""

from __future__ import annotations

from hypothesis import Phase, settings

import harness.plugin  # noqa: F401  (registers the "ci" profile this one derives from)

__all__ = ["PROFILE"]

PROFILE = "selfcheck"

settings.register_profile(
    PROFILE,
    parent=settings.get_profile("ci"),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    report_multiple_bugs=False,
)
