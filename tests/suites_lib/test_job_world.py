"""``job_world``: a fixed-size check runs at its preferred world size, or the session's next."""

from __future__ import annotations

import dataclasses

import pytest

import harness.api
import harness.run.session
from harness.wire.attach import AttachInfo
from suites.lib.controller import scenarios
from suites.lib.controller.scenarios import available_world_sizes, job_world


def _session(monkeypatch: pytest.MonkeyPatch, nproc: int, attach_world: int | None) -> None:
    """Make the harness believe it runs locally with ``--nproc nproc`` or attached to torchrun."""
    attach = (
        None
        if attach_world is None
        else AttachInfo("127.0.0.1", 29500, "t", attach_world, attach_world, 1)
    )
    transport = "local" if attach is None else "torchrun"
    config = dataclasses.replace(
        harness.api.current_config(), nproc=nproc, transport=transport, attach=attach
    )
    monkeypatch.setattr(harness.run.session.current(), "config", config)


@pytest.mark.parametrize("nproc", [2, 4, 8])
def test_local_mode_keeps_the_preferred_size(monkeypatch: pytest.MonkeyPatch, nproc: int) -> None:
    _session(monkeypatch, nproc, None)
    assert available_world_sizes() == list(range(1, nproc + 1))
    assert job_world() == 2
    assert job_world(2) == 2
    assert job_world(1) == 1


def test_a_one_rank_session_runs_what_can_run_on_one_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _session(monkeypatch, 1, None)
    assert job_world(2) == 1  # --nproc 1: a check that holds at any size runs on one rank
    # a check that needs two ranks keeps 2: the harness reports it as environment
    assert job_world(2, minimum=2) == 2


def test_local_mode_below_the_preferred_size_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _session(monkeypatch, 2, None)
    assert job_world(4) == 4  # the harness reports it as environment (--nproc too small)


def test_attach_mode_runs_every_size_up_to_torchruns(monkeypatch: pytest.MonkeyPatch) -> None:
    _session(monkeypatch, 4, 4)
    assert available_world_sizes() == [1, 2, 3, 4]  # sub-worlds of torchrun's ranks
    assert job_world() == 2
    assert job_world(3) == 3
    assert job_world(4) == 4
    assert harness.api.unavailable_reason(4) is None
    reason = harness.api.unavailable_reason(5)
    assert reason is not None and "world sizes 1 to 4" in reason


def test_attach_mode_with_fewer_ranks_keeps_the_preferred_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _session(monkeypatch, 1, 1)
    assert available_world_sizes() == [1]
    assert job_world(2, minimum=2) == 2  # no larger size: the harness reports environment
    assert job_world(2) == 1  # torchrun's one rank runs what can run on one rank
    assert job_world(1) == 1
    _session(monkeypatch, 4, 4)
    assert job_world(8) == 8


def test_picks_the_smallest_larger_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scenarios, "available_world_sizes", lambda: [1, 6, 3])
    assert job_world(2) == 3
    assert job_world(4) == 6
    assert job_world(3) == 3


@pytest.mark.parametrize("preferred", [0, -2])
def test_rejects_a_size_below_one(preferred: int) -> None:
    with pytest.raises(ValueError, match=rf"preferred={preferred}.*at least 1"):
        job_world(preferred)
