"""Names a package exports but imports only on first use.

The plugin modules load in every pytest run of an environment where shardcheck is installed
([Note: the plugins' cost] in :mod:`harness.entry.inplay`), so the packages they live in must not
import torch when imported: ``harness`` and ``harness.conformance`` name their exports'
homes, and :func:`lazy_exports` imports a home when one of its names is first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: MutableMapping[str, Any], homes: Mapping[str, str]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``homes[name]`` on first use and keeps the name
    in the module's ``namespace`` (its ``globals()``), so later uses cost nothing.

    Args:
        namespace: the package's ``globals()``.
        homes: exported name -> the module that defines it.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    return __getattr__
