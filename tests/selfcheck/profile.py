"""The ``selfcheck`` Hypothesis profile: ``ci`` that stops at the first failing example.

The self-check only needs to know that a broken strategy fails its clause's test; shrinking
the failing example (each step a multi-rank job) and explaining it would take minutes and
write patch files. Load this module with ``-p tests.selfcheck.profile`` and select the
profile with ``--hypothesis-profile=selfcheck``.
"""

from __future__ import annotations

from hypothesis import Phase, settings

from harness.plugin import PROFILE_EXAMPLES, register_hypothesis_profiles

__all__ = ["PROFILE"]

PROFILE = "selfcheck"

# shardcheck's "ci" profile, which this one derives from: the plugin registers its profiles
# only in a run that uses it, and importing it registers nothing (Hypothesis' own "ci", 100
# examples a check, would otherwise be the parent: a self-check run 8x slower)
register_hypothesis_profiles()
assert settings.get_profile("ci").max_examples == PROFILE_EXAMPLES["ci"]

settings.register_profile(
    PROFILE,
    parent=settings.get_profile("ci"),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    report_multiple_bugs=False,
)
