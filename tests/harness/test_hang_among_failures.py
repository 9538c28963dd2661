"""Ranks that fail in different ways, one of them hung: the verdict reads hang when the other
failures follow from it, and names the cause otherwise (single process, outcomes built by
hand as the pool returns them)."""

from __future__ import annotations

from harness.conformance.findings.grouping import failure_kind
from harness.conformance.findings.signatures import attribute
from harness.verdicts.collectives import Collective
from harness.verdicts.failures import CollectiveHang, failure_for
from harness.verdicts.outcomes import BUDGET_DETAIL, Outcome, RankFailure, RemoteError

STACK = (
    "Thread 0x1 (most recent call first):\n"
    '  File "/usr/lib/torch/distributed/distributed_c10d.py", line 10 in all_gather_single\n'
    '  File "/home/me/strategy.py", line 42 in save_checkpoint\n'
)
TIMEOUT = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 2700ms for recv "
    "operation to complete"
)


def _hung(rank: int, detail: str = "still running 3.0 s after rank 1 raised") -> Outcome:
    collective = Collective("all_gather_single", frame="/home/me/strategy.py:42 in save_checkpoint")
    return Outcome(rank, "hung", detail=detail, elapsed=6.0, stacks=STACK, collective=collective)


def _raised(rank: int, type_name: str, message: str, distributed: bool) -> Outcome:
    traceback = f'  File "/home/me/strategy.py", line 50 in save_checkpoint\n{type_name}: {message}'
    error = RemoteError(type_name, message, traceback, is_distributed=distributed)
    return Outcome(rank, "raised", error=error, elapsed=3.0)


def test_a_hang_whose_peer_gave_up_waiting_reads_hang() -> None:
    outcomes = [_hung(0), _raised(1, "torch.distributed.DistBackendError", TIMEOUT, True)]
    failure = failure_for(outcomes, "job 7: save_rank at world size 2")
    assert isinstance(failure, CollectiveHang)
    lines = str(failure).splitlines()
    assert lines[0] == "hang: rank(s) 1 gave up waiting for the others, who still wait in the job"
    assert (
        lines[1]
        == "  rank 0 waits in all_gather_single at /home/me/strategy.py:42 in save_checkpoint"
    )
    assert lines[2].startswith("  rank 1 raised torch.distributed.DistBackendError: [../third")
    # every rank's story follows: the hung rank's stack and the raise's traceback
    assert "rank 0 hung: still running 3.0 s after rank 1 raised" in str(failure)
    assert "in save_checkpoint" in str(failure) and "Timed out waiting 2700ms" in str(failure)
    # the finding is the hang, told by the hung rank, not the peer's timeout
    attribution = attribute(failure, ["CKPT-RT-6"])
    assert (attribution.kind, attribution.type_name) == ("hung", "hang")
    assert attribution.message == "still running 3.0 s after rank 1 raised"
    assert failure_kind(attribution, ["CKPT-RT-6"]) == "hang or desync"


def test_a_rank_that_raised_its_own_error_is_the_cause_not_the_hang() -> None:
    own = _raised(1, "ValueError", "size mismatch for layer.weight", False)
    failure = failure_for([_hung(0), own], "job 7: load_rank at world size 2")
    assert type(failure) is RankFailure
    assert str(failure).startswith("job 7: load_rank at world size 2: rank 1 raised, rank 0 hung")
    attribution = attribute(failure, ["CKPT-RT-6"])
    assert attribution.kind != "hung" and attribution.type_name == "ValueError"


def test_a_crash_among_hangs_stays_the_crash() -> None:
    crashed = Outcome(1, "crashed", exitcode=-11, elapsed=1.0)
    failure = failure_for([_hung(0), crashed], "job 7: load_rank at world size 2")
    assert type(failure) is RankFailure
    assert attribute(failure).kind == "crashed"


def test_every_rank_cut_off_by_the_tests_time_or_stuck_says_so_first() -> None:
    detail = f"{BUDGET_DETAIL} (27.0 s into the test, of pytest-timeout's 30 s)"
    failure = failure_for([_hung(0, detail), _hung(1, detail)], "job 3: load_rank at world size 2")
    assert isinstance(failure, CollectiveHang)
    first = str(failure).splitlines()[0]
    assert first == f"hang: every rank was {detail}"
    stuck = "stuck in a collective: no progress in 2 s"
    failure = failure_for([_hung(0, stuck), _hung(1, stuck)], "job 5: load_rank at world size 2")
    assert str(failure).splitlines()[0] == f"hang: every rank was {stuck}"
    plain = failure_for([_hung(0, "still running at the deadline (30.0 s)"), _hung(1)], "job 4")
    assert str(plain).splitlines()[0] == "hang: every rank was still inside the job at its deadline"
