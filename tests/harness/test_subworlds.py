"""Attach mode's sub-worlds without torchrun: the pools of several world sizes share one
command stream to the ranks ([Note: sub-worlds] in ``harness/pool/transports/store.py``).

A store server in this process stands in for torchrun's agent; no rank runs, so these tests
read what the controller writes: each command addressed to the first ``k`` ranks, a fresh
group for each start, and which pool's group holds the ranks.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from harness.pool.rankpool import switches_line
from harness.pool.transport import PoolSettings
from harness.pool.transports.store import AttachChannel, StoreTransport
from harness.rank.attached import sub_world_environ
from harness.wire.attach import AttachInfo, key
from harness.wire.protocol import Command, Kind


@pytest.fixture
def channel() -> Iterator[AttachChannel]:
    server = dist.TCPStore(
        "127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    info = AttachInfo("127.0.0.1", server.port, "t/", 4, 2, 2)
    yield AttachChannel(info)
    del server


def _addressed(channel: AttachChannel, seq: int) -> tuple[int, Any]:
    store = channel.store
    return int(store.get(key("to", seq))), pickle.loads(store.get(key("cmd", seq)))


def test_each_command_is_for_the_first_ranks_of_its_pool(channel: AttachChannel) -> None:
    four, two = StoreTransport(channel, 4), StoreTransport(channel, 2)
    settings = PoolSettings(world_size=4)
    assert not four.taken() and not two.taken()  # nothing formed yet: no switch
    first = four.start(1, settings)
    assert not four.taken() and two.taken()  # the ranks are in the group of four
    to, command = _addressed(channel, first)
    assert (to, command.kind, command.payload.world_size) == (4, Kind.START, 4)
    assert command.payload.warm_up  # the first group of these ranks warms them up
    job = two.send(Command(Kind.JOB, 7))
    assert _addressed(channel, job)[0] == 2
    second = two.start(1, PoolSettings(world_size=2))
    assert two.taken() is False and four.taken()
    to, command = _addressed(channel, second)
    assert (to, command.payload.world_size) == (2, 2)
    assert not command.payload.warm_up  # ranks 0 and 1 ran it with the group of four
    assert second > job > first  # one numbered stream: the group's store prefix is fresh


def test_closing_any_pool_stops_every_rank_once(channel: AttachChannel) -> None:
    one, three = StoreTransport(channel, 1), StoreTransport(channel, 3)
    one.close(1.0)
    three.close(1.0)
    assert channel.seq == 1 and three.closed
    to, command = _addressed(channel, 1)
    assert (to, command.kind) == (4, Kind.STOP)  # every rank, not only the pool's


def test_a_world_size_above_torchruns_is_refused(channel: AttachChannel) -> None:
    with pytest.raises(ValueError, match="serves world sizes 1 to 4"):
        StoreTransport(channel, 5)


def test_the_switch_line_counts_and_times_the_switches() -> None:
    assert switches_line({}, attached=False) == ""
    assert "no process group switch" in switches_line({4: []}, attached=True)
    line = switches_line({2: [0.1, 0.3], 4: [0.2]}, attached=True)
    assert line.startswith("attach mode switched the ranks' process group")
    assert "3 times (to 2: 2, to 4: 1)" in line
    assert "0.20 s per switch on average, 0.30 s at most, 0.6 s in all" in line


@pytest.mark.parametrize(
    ("world_size", "local_world_size", "local", "nodes"),
    [
        (4, 4, 4, 1),  # torchrun's own size on one node: torchrun's values
        (2, 4, 2, 1),  # the first two ranks of one node
        (4, 2, 2, 2),  # both of two nodes: torchrun's values
        (2, 2, 2, 1),  # node 0 of two
        (3, 2, 3, 1),  # spans two nodes without filling them: one node, on every rank
        (1, 2, 1, 1),
    ],
)
def test_a_sub_world_reads_the_launcher_variables_of_its_size(
    world_size: int, local_world_size: int, local: int, nodes: int
) -> None:
    environ = sub_world_environ(1, 1, world_size, local_world_size)
    assert environ["WORLD_SIZE"] == environ["ROLE_WORLD_SIZE"] == str(world_size)
    assert (environ["RANK"], environ["LOCAL_RANK"]) == ("1", "1")  # the process's own
    assert (environ["LOCAL_WORLD_SIZE"], environ["GROUP_WORLD_SIZE"]) == (str(local), str(nodes))
