"""Refusals: examples that cannot run here, and the one path that turns them into outcomes.

[Note: refusals] An example is *refused* when it cannot run in this session: the strategy
refused its configuration (:class:`harness.Unsupported`, outcome ``unsupported``) or the run
cannot give it what it needs (:class:`EnvironmentRefusal`, outcome ``environment``: a world
size an attach-mode run does not have). Whoever meets one calls
:meth:`harness.run.session.HarnessSession.refuse`, the one path: the session records it (the last
refusal of the test is kept, and the running check's observer hears of it), then inside a
Hypothesis example the example is rejected (the other examples still run) and outside one the
test is skipped with the refusal's wording. A Hypothesis test none of whose examples could run
ends in ``Unsatisfiable``; the plugins turn that into the skip of the refusal recorded
(``environment: ...``, or the check's ``unsupported: ...`` summary).
"""

from __future__ import annotations

__all__ = ["EnvironmentRefusal", "Refusal", "skip_exception"]


class Refusal(Exception):
    """An example that cannot run in this session; :attr:`outcome` says why in one word."""

    #: the check's outcome when none of its examples could run
    outcome = "refused"

    def describe(self) -> str:
        """The wording of the skip (and the report): ``outcome: reason``."""
        return str(self)


class EnvironmentRefusal(Refusal):
    """The run cannot give the example what it needs (a world size, a device).

    Args:
        reason: the skip's wording, starting ``environment:`` and saying what to change.
    """

    outcome = "environment"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def skip_exception(reason: str) -> BaseException:
    """The skip pytest reports at the test's own location, with ``reason``."""
    import pytest

    return pytest.skip.Exception(reason, _use_item_location=True)
