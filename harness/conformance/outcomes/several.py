"""The outcome of a check whose Hypothesis search met several distinct failures.

pytest summarises Hypothesis' exception group as ``ExceptionGroup: Hypothesis found 2
distinct failures``, which names no verdict of its own kind: such a check read ``failed``
even when its failures were a desync and the ranks' failures that followed it (a replay of
the example in the broken process group, a hang found in another example). A check of
several failures of which one is a desync or a hang reads that verdict (``desync`` before
``hang``) when every other failure is the ranks' too (a
:class:`~harness.verdicts.outcomes.RankFailure`: a rank raised, crashed or hung); one
failure that a suite's comparison found (a wrong value, an assertion in the test) keeps the
check ``failed``. Failures inside a flaky one and pytest-timeout's are set aside first, as
the findings do (:func:`harness.conformance.findings.signatures.distinct_failures`).
"""

from __future__ import annotations

from harness.conformance.findings.signatures import distinct_failures
from harness.verdicts.failures import CollectiveDesync, CollectiveHang
from harness.verdicts.outcomes import RankFailure

__all__ = ["verdict_of_several"]

#: the verdicts of their own kind, the worst first
_KINDS = ((CollectiveDesync, "desync"), (CollectiveHang, "hang"))


def verdict_of_several(exc: BaseException) -> str:
    """``desync`` or ``hang`` for several distinct failures that read so (see the module
    docstring), else ``""`` (one failure, or one that a suite's comparison found)."""
    leaves = [leaf for leaf, _ in distinct_failures(exc)]
    if len(leaves) < 2 or not all(isinstance(leaf, RankFailure) for leaf in leaves):
        return ""
    for cls, kind in _KINDS:
        if any(isinstance(leaf, cls) for leaf in leaves):
            return kind
    return ""
