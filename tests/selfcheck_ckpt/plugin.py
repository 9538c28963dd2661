"""A pytest plugin for the self-check's inner runs (loaded with ``-p selfcheck_ckpt.plugin``).

- Registers the Hypothesis profile ``selfcheck``: the ``ci`` profile's settings without the
  shrink phase. A broken strategy is caught by the first failing example; shrinking it would
  cost one job per attempt and tell the self-check nothing more.
"""

from __future__ import annotations

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
