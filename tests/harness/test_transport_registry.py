"""The transport registry: a session reaches its ranks through the transport its settings
name, and a new transport is one module plus its line in ``harness.pool.transports.TRANSPORTS``
([Note: adding a transport] in ``harness/pool/transport.py``)."""

from __future__ import annotations

import sys
import types
from types import MappingProxyType
from typing import Any

import pytest

import harness.pool.transports
from harness import api
from harness.config import HarnessConfig
from harness.pool.transport import Transport
from harness.pool.transports import TRANSPORTS, transport_kind
from harness.pool.transports.pipes import LocalRanks
from harness.run import session as session_module
from harness.run.session import HarnessSession

KIND_MEMBERS = ("gpu_ranks", "open", "warm_up", "stop")


def test_every_registered_transport_is_a_kind_under_its_own_name() -> None:
    assert sorted(TRANSPORTS) == ["local", "torchrun"]
    for name in TRANSPORTS:
        kind = transport_kind(name)
        assert kind.name == name
        assert [m for m in KIND_MEMBERS if not callable(getattr(kind, m, None))] == []


def test_an_unknown_transport_is_refused_with_the_names_there_are() -> None:
    with pytest.raises(ValueError, match="no transport is named 'pigeon'") as info:
        transport_kind("pigeon")
    assert "local, torchrun" in str(info.value)
    assert "harness/pool/transports/__init__.py" in str(info.value)  # where to register one
    with pytest.raises(ValueError, match="no transport is named 'pigeon'"):
        HarnessSession(HarnessConfig(nproc=2, transport="pigeon"))


def test_the_torchrun_transport_and_attach_information_go_together() -> None:
    with pytest.raises(ValueError, match="transport 'torchrun' with attach information missing"):
        HarnessConfig(nproc=2, transport="torchrun").check()


class _CountingRanks(LocalRanks):
    """The local transport under another name, counting what the session asks of it."""

    name = "counted"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def open(self, config: HarnessConfig, world_size: int, root: str) -> Transport:
        self.calls.append(("open", world_size))
        return super().open(config, world_size, root)

    def warm_up(self, config: HarnessConfig) -> None:
        self.calls.append(("warm_up", None))
        super().warm_up(config)

    def stop(self) -> None:
        self.calls.append(("stop", None))  # the local forkserver stays for the other tests


def rank_and_world(ctx: Any) -> tuple[int, int]:
    return ctx.rank, ctx.world_size


def test_a_registered_transport_carries_the_sessions_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    kind = _CountingRanks()
    module = types.ModuleType("counted_transport")
    module.KIND = kind  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "counted_transport", module)
    registry = MappingProxyType({**TRANSPORTS, "counted": "counted_transport"})
    monkeypatch.setattr(harness.pool.transports, "TRANSPORTS", registry)

    session = HarnessSession(HarnessConfig(nproc=2, backend="gloo", transport="counted"))
    session_module.activate(session)
    try:
        session.warm_up()
        results = api.run_on_ranks(rank_and_world, world_size=2)
    finally:
        session.shutdown(final=True)
        session_module.deactivate(session)
    assert results == [(0, 2), (1, 2)]  # every rank answered through the registered transport
    assert kind.calls == [("warm_up", None), ("open", 2), ("stop", None)]
