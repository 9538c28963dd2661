"""Whether a pytest run uses shardcheck: the rule the plugins share, and their start.

[Note: the plugins' cost] The plugins load through ``pytest11`` entry points, so in *every*
pytest run of an environment where shardcheck is installed. Their modules (and what they
import at module level) import only pytest and the standard library: options, markers and
cheap hooks. torch, Hypothesis' profiles, the harness session (its forkserver and pools) and
the conformance plugin start only in a run that uses the harness (:func:`wanted`), at
``pytest_cmdline_main``/``pytest_configure``; or, in a run whose first sign of the harness is a
test module that imports it or a test with a ``world_size``/``clause`` marker, during
collection (:func:`activate`, before any test runs). The rule, first match wins:

- a shardcheck option is given (any of the plugins' options, on the command line or in
  ``addopts``), or ``SHARDCHECK_STRATEGY``/``SHARDCHECK_ATTACH`` is set (``python -m
  harness.attach`` sets the latter for the controller);
- a plugin was loaded by module name (``-p harness.plugin``, ``-p harness.conformance``,
  a conftest's ``pytest_plugins``) rather than by its entry point;
- the rootdir is this project's checkout (its ``tests/`` and ``suites/``);
- an argument names a path in the installed ``suites`` or ``harness`` packages, or a
  ``--pyargs`` module in them;
- a conftest already imported a harness module (one not in :data:`LIGHT`) or ``suites``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "activate",
    "harness_imported",
    "is_active",
    "newly_imported",
    "remember_options",
    "remember_session",
    "wanted",
]

#: the harness modules an unrelated run imports: these, and the packages in :data:`LIGHT_PACKAGES`
#: (a package's own ``__init__`` counts: ``harness.pool`` and ``harness.rank`` hold a docstring)
LIGHT = frozenset(
    {
        "harness",
        "harness.conformance",
        "harness.plugin",
        "harness.pool",
        "harness.pool.resources",
        "harness.rank",
        "harness.rank.coverage",  # the rank side of --rank-coverage, which its plugin imports
        "harness.rank.coverage_config",
    }
)
LIGHT_PACKAGES = ("harness.entry", "harness.rankcoverage", "harness.clauses")
#: environment variables that say the run is a shardcheck run
ENV_VARS = ("SHARDCHECK_STRATEGY", "SHARDCHECK_ATTACH")

#: dest -> (option string, default) of every option the plugins add (:func:`remember_options`)
OPTIONS: dict[str, tuple[str, Any]] = {}

_WANTED = pytest.StashKey[str | None]()
_ACTIVE = pytest.StashKey[bool]()
_SESSION = pytest.StashKey[pytest.Session]()
_MODULES_SEEN = pytest.StashKey[int]()


def remember_options(group: Any) -> None:
    """Remember the options of a plugin's option group (its ``pytest_addoption`` calls this
    last), for :func:`wanted`."""
    for option in getattr(group, "options", []):
        names = list(option.names())
        long_names = [n for n in names if n.startswith("--")] or names
        if long_names:
            OPTIONS[option.dest] = (long_names[0], option.default)


def _light(name: str) -> bool:
    return name in LIGHT or any(name == p or name.startswith(p + ".") for p in LIGHT_PACKAGES)


def harness_imported(modules: Iterable[str] | None = None) -> bool:
    """Whether a harness module beyond the plugins' light ones, or ``suites``, is imported."""
    for name in list(sys.modules) if modules is None else modules:
        if name == "suites" or name.startswith("suites."):
            return True
        if name.startswith("harness.") and not _light(name):
            return True
    return False


def _option_given(config: pytest.Config) -> str | None:
    args = [str(a) for a in config.invocation_params.args]
    for dest, (name, default) in OPTIONS.items():
        value = getattr(config.option, dest, default)
        if value != default or any(a == name or a.startswith(name + "=") for a in args):
            return f"{name} is given"
    for var in ENV_VARS:
        if os.environ.get(var):
            return f"{var} is set"
    return None


def _by_module_name(config: pytest.Config) -> str | None:
    manager = config.pluginmanager
    for name in ("harness.plugin", "harness.conformance"):
        module = sys.modules.get(name)
        if module is not None and manager.get_name(module) == name:
            return f"-p {name}"
    return None


def _our_paths(config: pytest.Config) -> str | None:
    import importlib.util

    harness_dir = Path(__file__).resolve().parent
    root = config.rootpath
    if (root / "harness" / "plugin.py").is_file() and (root / "suites").is_dir():
        return "the rootdir is shardcheck's checkout"
    packages = [harness_dir]
    spec = importlib.util.find_spec("suites")
    if spec is not None and spec.submodule_search_locations:
        packages += [Path(p).resolve() for p in spec.submodule_search_locations]
    pyargs = bool(getattr(config.option, "pyargs", False))
    for arg in config.args:
        target = str(arg).split("::")[0]
        if pyargs and target.split(".")[0] in ("suites", "harness"):
            return f"--pyargs {target}"
        path = Path(target) if os.path.isabs(target) else config.invocation_params.dir / target
        try:
            path = path.resolve()
        except OSError:
            continue
        if any(path == p or p in path.parents for p in packages):
            return f"{arg} is in shardcheck"
    return None


def wanted(config: pytest.Config) -> str | None:
    """Why this run uses the harness (see the module's docstring), or None; decided once."""
    if _WANTED in config.stash:
        return config.stash[_WANTED]
    if getattr(config.option, "help", False) or getattr(config.option, "version", False):
        return None  # not cached: the options are not parsed yet
    reason = (
        _option_given(config)
        or _by_module_name(config)
        or _our_paths(config)
        or ("a conftest imports the harness" if harness_imported() else None)
    )
    config.stash[_WANTED] = reason
    return reason


def is_active(config: pytest.Config) -> bool:
    """Whether :func:`activate` started the plugins' heavy part in this run."""
    return config.stash.get(_ACTIVE, False)


def remember_session(session: pytest.Session) -> None:
    """Keep the pytest session for a start during collection (its sessionstart has run)."""
    session.config.stash[_SESSION] = session


def newly_imported(config: pytest.Config) -> bool:
    """Whether the harness was imported since this was last asked (cheap when nothing was
    imported in between: it looks again only when ``sys.modules`` grew)."""
    count = len(sys.modules)
    if config.stash.get(_MODULES_SEEN, -1) == count:
        return False
    config.stash[_MODULES_SEEN] = count
    return harness_imported()


def activate(config: pytest.Config) -> bool:
    """Start the heavy part of every shardcheck plugin this run loaded (once): Hypothesis'
    profiles, the harness session, the conformance plugin. True when this call started it."""
    if is_active(config):
        return False
    config.stash[_ACTIVE] = True
    session = config.stash.get(_SESSION, None)
    manager = config.pluginmanager
    # the plugin modules are imported already (they called this); looked up, not imported,
    # so that this module stays below both of them
    plugin = sys.modules.get("harness.plugin")
    conformance = sys.modules.get("harness.conformance")
    if plugin is not None:
        plugin.register_hypothesis_profiles()
        if manager.is_registered(plugin):
            plugin.start(config, session)
    if conformance is not None and manager.is_registered(conformance):
        conformance.start(config, session)
    return True
