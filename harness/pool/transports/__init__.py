"""The registry of the ways a :class:`harness.pool.rankpool.RankPool` reaches its ranks
(:mod:`harness.pool.transport`, [Note: adding a transport]).

- ``local``: :mod:`~harness.pool.transports.pipes`, rank processes forked on this machine.
- ``torchrun``: :mod:`~harness.pool.transports.store`, the ranks of a torchrun run (attach mode).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, cast

if TYPE_CHECKING:
    from harness.pool.transport import TransportKind

__all__ = ["TRANSPORTS", "loaded_kinds", "transport_kind"]

#: transport name -> the module whose ``KIND`` it is (imported on first use: attach mode's
#: store client is not imported by a local run)
TRANSPORTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "local": "harness.pool.transports.pipes",
        "torchrun": "harness.pool.transports.store",
    }
)


def transport_kind(name: str) -> TransportKind:
    """The transport registered as ``name``.

    Raises:
        ValueError: no transport has that name (the message lists those that exist).
    """
    module = TRANSPORTS.get(name)
    if module is None:
        raise ValueError(
            f"no transport is named {name!r}; the transports are {', '.join(TRANSPORTS)} "
            "(a new one is registered in harness/pool/transports/__init__.py)."
        )
    return cast("TransportKind", importlib.import_module(module).KIND)


def loaded_kinds() -> list[TransportKind]:
    """The transports whose module this process imported (those that may have something
    to stop at exit)."""
    return [transport_kind(name) for name, module in TRANSPORTS.items() if module in sys.modules]
