"""Parts of the hang and desync verdicts, single process: parsing, deadlines, warnings."""

from __future__ import annotations

import os
import pickle
import subprocess
import time

import torch

from harness.pool.stall import StallProbe, cpu_seconds, runnable_threads
from harness.run.deadlines import Deadlines
from harness.verdicts.collectives import own_fingerprint, waiting_collective
from harness.verdicts.flight import flight_recorder_environ, last_collectives, trace_prefix
from harness.verdicts.outcomes import Outcome
from harness.verdicts.rankwarnings import RankWarnings, shape


def test_own_fingerprint_reads_each_ranks_part() -> None:
    message = (
        "Detected mismatch between collectives on ranks. Rank 1 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=4, OpType=ALLGATHER, TensorShape=[2, 3], "
        "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float)), but Rank 0 is "
        "running collective: CollectiveFingerPrint(SequenceNumber=4OpType=BARRIER)."
    )
    one = own_fingerprint(message, 1)
    assert one is not None and (one.op, one.shapes, one.dtypes) == ("ALLGATHER", "[2, 3]", "Float")
    zero = own_fingerprint(message, 0)
    assert zero is not None and zero.op == "BARRIER" and zero.shapes == ""
    assert own_fingerprint(message, 2) is None


def test_waiting_collective_reads_a_stack_dump() -> None:
    torch_dir = os.path.dirname(torch.__file__)
    c10d = os.path.join(torch_dir, "distributed", "distributed_c10d.py")
    logger = os.path.join(torch_dir, "distributed", "c10d_logger.py")
    stacks = (
        "Current thread 0x1 (most recent call first):\n"
        f'  File "{c10d}", line 10 in barrier\n'
        f'  File "{logger}", line 8 in wrapper\n'
        '  File "/home/me/strategy.py", line 42 in load_checkpoint\n'
        '  File "/home/me/test_it.py", line 7 in job\n'
    )
    found = waiting_collective(stacks)
    assert found is not None
    assert found.op == "barrier"
    assert found.frame == "/home/me/strategy.py:42 in load_checkpoint"
    assert waiting_collective('  File "/home/me/x.py", line 1 in spin\n') is None


def test_deadlines_learn_from_passing_jobs_under_the_ceiling() -> None:
    d = Deadlines(ceiling=120.0)
    assert d.deadline("check", "fn") == 30.0  # the first job
    d.learn("check", "fn", [Outcome(0, "ok", elapsed=0.2), Outcome(1, "ok", elapsed=0.3)])
    assert d.deadline("check", "fn") == 10.0  # max(10 s, 20 x 0.3 s)
    d.learn("check", "fn", [Outcome(0, "ok", elapsed=2.0), Outcome(1, "hung", elapsed=99.0)])
    assert d.deadline("check", "fn") == 10.0  # failed jobs teach nothing
    d.learn("check", "fn", [Outcome(0, "ok", elapsed=9.0)])
    assert d.deadline("check", "fn") == 120.0  # 180 s, capped by --rank-timeout
    assert Deadlines(ceiling=12.0).deadline("other", "fn") == 12.0


def test_rank_warnings_are_counted_once_per_distinct_warning() -> None:
    w = ("FutureWarning", "old API", "/x/fsdp.py", 3)
    other = ("UserWarning", "careful", "/x/y.py", 9)
    collected = RankWarnings()
    for _ in range(3):
        a, b = Outcome(0, "ok"), Outcome(1, "ok")
        a.warning_records, b.warning_records = (w, w), (w, other)
        collected.add([a, b])
    assert collected.lines() == [
        "/x/fsdp.py:3: FutureWarning: old API",
        "  9x, on rank(s) 0, 1, in 3 job(s)",
        "/x/y.py:9: UserWarning: careful",
        "  3x, on rank(s) 1, in 3 job(s)",
    ]


def test_flight_recorder_is_turned_on_and_its_dump_read(tmp_path) -> None:
    prefix = trace_prefix(str(tmp_path))
    env = flight_recorder_environ(prefix)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DESYNC_DEBUG"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
    entries = [
        {
            "profiling_name": f"nccl:{name}",
            "collective_seq_id": seq,
            "input_sizes": [[4, 2]],
            "input_dtypes": ["Float"],
            "state": state,
            "process_group": ("0", "default_pg"),
        }
        for seq, name, state in [(1, "broadcast", "completed"), (2, "all_reduce", "started")]
    ]
    with open(f"{prefix}1", "wb") as f:
        pickle.dump({"version": "2.4", "entries": entries}, f)
    assert last_collectives(f"{prefix}1") == (
        "#1 nccl:broadcast sizes=[[4, 2]] dtypes=['Float'] state=completed group=0\n"
        "#2 nccl:all_reduce sizes=[[4, 2]] dtypes=['Float'] state=started group=0"
    )
    assert last_collectives(f"{prefix}1", count=1).startswith("#2 nccl:all_reduce")
    assert last_collectives(f"{prefix}0") == ""  # no dump: nothing


def _in_collective(line: int) -> str:
    c10d = os.path.join(os.path.dirname(torch.__file__), "distributed", "distributed_c10d.py")
    return (
        "Thread 0x1 (most recent call first):\n"
        f'  File "{c10d}", line 10 in barrier\n'
        f'  File "/home/me/job.py", line {line} in job\n'
    )


def _wait_until_asleep(pid: int) -> None:
    """Wait (at most 60 s) until process ``pid`` has no runnable thread: a process just
    started is runnable while it execs, and waits for a core to do it on a busy machine
    (the fresh-clone CI run saw it runnable after 5 s, right after the hang tests)."""
    end = time.monotonic() + 60.0
    while runnable_threads(pid) and time.monotonic() < end:
        time.sleep(0.01)
    assert runnable_threads(pid) == 0, f"process {pid} never went to sleep"


def test_stall_needs_two_equal_samples_in_collectives_without_cpu() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])  # a process that waits: no CPU, not runnable
    try:
        rank = sleeper.pid
        _wait_until_asleep(rank)
        assert cpu_seconds(rank) is not None
        probe = StallProbe(next_at=0.0, every=3.0)
        assert not probe.sample(10.0, {0: _in_collective(5)}, [rank])  # one sample: not yet
        assert probe.next_at == 13.0
        assert probe.sample(13.0, {0: _in_collective(5)}, [rank])  # same stack, idle
        assert not probe.sample(16.0, {0: _in_collective(6)}, [rank])  # it moved
        assert not probe.sample(19.0, {0: '  File "/home/me/job.py", line 6 in job\n'}, [rank])
        assert not probe.sample(22.0, {0: _in_collective(6)}, [rank])  # not in one before
        # this process runs (its thread is runnable in both samples): starved, not stuck
        me = os.getpid()
        busy = StallProbe(next_at=0.0, every=3.0)
        assert not busy.sample(10.0, {0: _in_collective(5)}, [me])
        assert not busy.sample(13.0, {0: _in_collective(5)}, [me])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_rank_warnings_of_one_shape_are_folded_under_the_first() -> None:
    fsdp = "/t/fsdp.py"
    switch = (
        "FSDP is switching to use `NO_SHARD` instead of ShardingStrategy.{} since the world "
        "size is 1."
    )
    returned = (
        "When using ``NO_SHARD`` for ``ShardingStrategy``, full_state_dict will{}be returned."
    )
    both = "{} has both parameters with requires_grad=True and False."
    records = [
        ("UserWarning", switch.format("FULL_SHARD"), fsdp, 10),
        ("UserWarning", switch.format("SHARD_GRAD_OP"), fsdp, 10),
        ("UserWarning", returned.format(" "), "/t/sd.py", 710),
        ("UserWarning", returned.format(""), "/t/sd.py", 829),  # torch's own typo: "willbe"
        ("UserWarning", both.format("blocks.0"), "/t/wrap.py", 159),
        ("UserWarning", both.format("blocks.1.inner.0"), "/t/wrap.py", 159),
        ("FutureWarning", both.format("blocks.0"), "/t/wrap.py", 159),  # another category
    ]
    collected = RankWarnings()
    a, b = Outcome(0, "ok"), Outcome(1, "ok")
    a.warning_records, b.warning_records = tuple(records), tuple(records[:2])
    collected.add([a, b])
    assert collected.lines() == [
        f"{fsdp}:10: UserWarning: {switch.format('FULL_SHARD')}",
        "  4x, on rank(s) 0, 1, in 1 job(s); 1 more like it",
        f"/t/sd.py:710: UserWarning: {returned.format(' ')}",
        "  2x, on rank(s) 0, in 1 job(s); 1 more like it",
        f"/t/wrap.py:159: UserWarning: {both.format('blocks.0')}",
        "  2x, on rank(s) 0, in 1 job(s); 1 more like it",
        f"/t/wrap.py:159: FutureWarning: {both.format('blocks.0')}",
        "  1x, on rank(s) 0, in 1 job(s)",
    ]


def test_warnings_that_differ_in_words_stay_apart() -> None:
    assert shape("parameter 'a' is deprecated") == shape("parameter 'bc' is deprecated")
    assert shape("old API") != shape("new API")
    assert shape("size 3 of x.y") == shape("size 12 of a.b.c")


def test_waiting_collective_reads_a_dtensor_redistribute() -> None:
    # a rank blocked in DTensor's redistribute: a functional collective waiting in
    # wait_tensor, no c10d frame on the stack
    distributed = os.path.join(os.path.dirname(torch.__file__), "distributed")
    funcol = os.path.join(distributed, "_functional_collectives.py")
    redistribute = os.path.join(distributed, "tensor", "_redistribute.py")
    stacks = (
        "Thread 0x2 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
        "\n"
        "Current thread 0x1 (most recent call first):\n"
        f'  File "{funcol}", line 144 in wait_tensor\n'
        f'  File "{funcol}", line 205 in _maybe_wrap_tensor\n'
        f'  File "{funcol}", line 331 in all_gather_tensor\n'
        f'  File "{redistribute}", line 220 in redistribute_local_tensor\n'
        '  File "/home/me/strategy.py", line 88 in gather_full\n'
    )
    found = waiting_collective(stacks)
    assert found is not None
    assert found.op == "all_gather_tensor"
    assert found.frame == "/home/me/strategy.py:88 in gather_full"
    utils = os.path.join(distributed, "tensor", "_collective_utils.py")
    scatter = f'  File "{utils}", line 150 in mesh_scatter\n  File "/home/me/s.py", line 3 in put\n'
    found = waiting_collective(scatter)
    assert found is not None and found.op == "mesh_scatter"
    # what a rank blocked in DTensor.full_tensor() dumped (gloo, torch 2.13): the gather
    # waits in AsyncCollectiveTensor.wait -> wait_tensor, under torch's op machinery
    api = os.path.join(distributed, "tensor", "_api.py")
    ops = os.path.join(os.path.dirname(torch.__file__), "_ops.py")
    full_tensor = (
        "Thread 0x00007f5be1693b80 (most recent call first):\n"
        f'  File "{ops}", line 882 in redispatch\n'
        f'  File "{funcol}", line 142 in wait_tensor\n'
        f'  File "{funcol}", line 1122 in wait\n'
        f'  File "{redistribute}", line 1766 in redistribute_local_tensor\n'
        f'  File "{api}", line 774 in full_tensor\n'
        '  File "/home/me/strategy.py", line 14 in gather_model\n'
    )
    found = waiting_collective(full_tensor)
    assert found is not None and found.op == "wait_tensor"
    assert found.frame == "/home/me/strategy.py:14 in gather_model"
    # DTensor's own frames alone (no collective file) are no collective
    assert (
        waiting_collective(f'  File "{redistribute}", line 220 in redistribute_local_tensor\n')
        is None
    )
