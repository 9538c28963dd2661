"""``--reproduce-failure VERSION:BLOB``: replay one check's exact failing example from the
command line, without editing the suite.

Hypothesis prints ``@reproduce_failure('6.170.17', b'AXic...')`` under a failure: the decorator
replays that very example. The reproducer line (:func:`harness.conformance.output.facts.reproducer`)
turns it into this option, which puts the same instruction on the one selected test (what the
decorator does) once collection is done.

A state machine's check is a plain test that calls ``run_state_machine_as_test`` on a machine
class it may build on the spot, and Hypothesis reads the instruction from that class (it copies
it onto the ``@given`` test it builds for each run). So for a test that is not ``@given`` the
instruction goes on ``RuleBasedStateMachine`` itself, which every machine class inherits it
from, until the run ends.

A replay that shows no failure says so (:class:`NothingReplayed`, the check's outcome
``error``: no finding is made of it): the selected test passed, so no example of it read the
blob (a plain test that runs no state machine; Hypothesis raises ``DidNotReproduce`` for
any test that did read it), or the example ran and did not fail (Hypothesis'
``DidNotReproduce``: the bug is gone, or the blob no longer fits the test's draws).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from harness.hypothesis_compat import REPRODUCE_FAILURE_ATTRIBUTE

__all__ = [
    "DECORATOR",
    "NothingReplayed",
    "apply",
    "as_option",
    "not_reproduced",
    "parse",
    "replayed_nothing",
]

#: Hypothesis' instruction under a failure: ``@reproduce_failure('VERSION', b'BLOB')``
DECORATOR = re.compile(r"@reproduce_failure\(\s*'([^']*)'\s*,\s*b'([^']*)'\s*\)")
_VALUE = re.compile(r"^(\d+(?:\.\d+)*):([A-Za-z0-9+/=]+)$")
#: the attribute Hypothesis' ``reproduce_failure`` decorator sets on a test
_ATTRIBUTE = REPRODUCE_FAILURE_ATTRIBUTE


class NothingReplayed(Exception):
    """``--reproduce-failure`` showed no failure (the message says why and what to do)."""


def replayed_nothing(check: str) -> NothingReplayed:
    """The error for a selected test that passed: no example of it read the blob."""
    return NothingReplayed(
        f"--reproduce-failure replayed nothing: {check} passed without running the example "
        "(it is no Hypothesis @given test and ran no state machine, so nothing read the "
        "blob); select the check whose finding printed the blob, as its reproduce line does."
    )


def not_reproduced(check: str, exc: BaseException) -> NothingReplayed:
    """The error for an example that was replayed and did not fail (Hypothesis'
    ``DidNotReproduce`` as ``exc``)."""
    return NothingReplayed(
        f"--reproduce-failure replayed the example of {check}, and it did not fail: {exc} "
        "(the bug is gone, or the blob is another check's, or this check's draws changed "
        "since it was printed)"
    )


def as_option(text: str) -> str:
    """``--reproduce-failure=VERSION:BLOB`` for the first decorator in ``text``, or ``""``."""
    found = DECORATOR.search(text)
    return f"--reproduce-failure={found.group(1)}:{found.group(2)}" if found else ""


def parse(value: str) -> tuple[str, bytes]:
    """The Hypothesis version and blob of ``--reproduce-failure``.

    Raises:
        pytest.UsageError: not ``VERSION:BLOB``.
    """
    found = _VALUE.match(value.strip())
    if found is None:
        raise pytest.UsageError(
            f"--reproduce-failure={value!r} is not VERSION:BLOB; copy it from a finding's "
            "reproduce line, e.g. --reproduce-failure=6.170.17:AXicY2BkAAAABQAC"
        )
    return found.group(1), found.group(2).encode()


def apply(value: str, items: list[pytest.Item]) -> None:
    """Give the one selected test the example to replay.

    Raises:
        pytest.UsageError: not exactly one test selected.
    """
    version, blob = parse(value)
    if len(items) != 1:
        raise pytest.UsageError(
            f"--reproduce-failure replays one check's example, but {len(items)} tests are "
            "selected; pass the check's node id as the reproduce line does."
        )
    item = items[0]
    test: Any = getattr(item, "obj", None)
    if getattr(test, "hypothesis", None) is not None:
        setattr(test, _ATTRIBUTE, (version, blob))
        return
    # a plain test: the state machine classes it runs read the instruction (module docstring)
    from hypothesis.stateful import RuleBasedStateMachine

    before = RuleBasedStateMachine.__dict__.get(_ATTRIBUTE)
    setattr(RuleBasedStateMachine, _ATTRIBUTE, (version, blob))

    def restore() -> None:
        if before is None:
            delattr(RuleBasedStateMachine, _ATTRIBUTE)
        else:
            setattr(RuleBasedStateMachine, _ATTRIBUTE, before)

    item.config.add_cleanup(restore)
