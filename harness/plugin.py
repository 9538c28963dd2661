"""shardcheck's pytest plugin: options, Hypothesis profiles, the world_size marker, pools.

Loaded through the ``pytest11`` entry point ``shardcheck`` (or ``-p harness.plugin``).

Options: ``--nproc N`` (largest world size), ``--backend auto|gloo|nccl``, ``--rank-timeout
SECONDS`` (default job deadline), ``--strategy MODULE:CALLABLE`` (env ``SHARDCHECK_STRATEGY``),
``--strategy-option KEY=VALUE`` (repeatable) and ``--shared-dir DIR`` (where job files go;
needed by attach mode across nodes). Under ``python -m harness.attach`` (torchrun) the plugin
drives torchrun's ranks instead of starting its own (:mod:`harness.attach`). Hypothesis
profiles ``ci``, ``dev`` (the default) and ``nightly`` are registered before Hypothesis' own
``--hypothesis-profile`` option loads one. Each rank's output
of a job is attached to the test's report as sections ``rank N stdout``/``stderr``; rank
warnings are counted once per distinct warning and shown in one summary at the end.
Pools stop at the end of the session (also after Ctrl-C and ``-x``).

In a run that does not use the harness this module costs (nearly) nothing: it imports no
torch and starts no session; see [Note: the plugins' cost] in :mod:`harness.entry.inplay` for the
rule, and :func:`start` for what a run that does use it gets.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from harness.entry import inplay, sigterm
from harness.entry.defaults import BACKENDS, DEFAULT_FACTORY, STRATEGY_ENV
from harness.pool import resources

__all__ = ["register_hypothesis_profiles", "start"]

MARKER = "world_size"
#: examples per Hypothesis check. ``ci`` is fast and derandomized: the suites reach every
#: supported pair of configuration values and every (clause, value) pair by construction
#: (explicit examples and covering rows, the same in every profile), so its random draws add
#: variety, not coverage; ``dev`` and ``nightly`` are where randomized search pays.
PROFILE_EXAMPLES = {"ci": 6, "dev": 25, "nightly": 250}


def register_hypothesis_profiles() -> None:
    """Register ``ci``/``dev``/``nightly`` (replacing Hypothesis' built-in ``ci``).

    ``dev`` becomes the active profile unless Hypothesis already loaded ``ci`` (it does so
    when it detects a CI environment), in which case our ``ci`` is reloaded.
    """
    from hypothesis import HealthCheck, settings

    common: dict[str, Any] = {
        "deadline": None,  # the job deadline (--rank-timeout) replaces Hypothesis' deadline
        "print_blob": True,
        # unsupported configurations are rejected examples: a strategy that refuses many
        # drawn configurations must not turn a check with some runnable examples into an error
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
    }
    settings.register_profile(
        "ci", max_examples=PROFILE_EXAMPLES["ci"], derandomize=True, database=None, **common
    )
    # dev and nightly inherit from Hypothesis' own default profile, not from whatever profile
    # is loaded now: under a CI environment Hypothesis has already loaded its "ci" profile
    # (derandomized, no database), which nightly must not inherit.
    library_default = settings.get_profile("default")
    for name in ("dev", "nightly"):
        settings.register_profile(
            name,
            parent=library_default,
            max_examples=PROFILE_EXAMPLES[name],
            derandomize=False,
            **common,
        )
    current = settings.get_current_profile_name()
    if current in ("default", "ci"):
        settings.load_profile("ci" if current == "ci" else "dev")


def check_hypothesis_profile(name: str | None) -> None:
    """Refuse a ``--hypothesis-profile`` nobody registered, naming the registered ones.

    Raises:
        pytest.UsageError: the profile is not registered.
    """
    if not name:
        return
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    try:
        settings.get_profile(name)
    except InvalidArgument:
        known = sorted(getattr(settings, "_profiles", None) or {"default", *PROFILE_EXAMPLES})
        raise pytest.UsageError(
            f"--hypothesis-profile={name!r} is not a registered Hypothesis profile; "
            f"pass one of: {', '.join(known)}."
        ) from None


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Register our Hypothesis profiles when the run uses the harness or names a profile, and
    check ``--hypothesis-profile``: before any plugin is configured, so before Hypothesis'
    plugin loads it (an INTERNALERROR otherwise) and before any rank starts."""
    profile = config.getoption("--hypothesis-profile", default=None)
    if profile or inplay.wanted(config):
        register_hypothesis_profiles()
    check_hypothesis_profile(profile)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the shardcheck options."""
    group = parser.getgroup("shardcheck", "shardcheck rank pool")
    group.addoption(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="largest world size (default: number of GPUs if >= 2, else 4)",
    )
    group.addoption(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="process-group backend; auto = nccl for the world sizes the GPUs cover (one GPU "
        "per rank), gloo above (gloo ranks see no GPU)",
    )
    group.addoption(
        "--rank-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="default deadline of one job on the ranks (default 120)",
    )
    group.addoption(
        "--strategy",
        default=None,
        metavar="MODULE:CALLABLE",
        help=f"strategy factory under test (env {STRATEGY_ENV}; default {DEFAULT_FACTORY})",
    )
    group.addoption(
        "--shared-dir",
        default=None,
        metavar="DIR",
        help="directory for job files (checkpoints); in attach mode across nodes it must be on "
        "a filesystem every node mounts at the same path",
    )
    group.addoption(
        "--strategy-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option passed to the factory in spec.extra (repeatable)",
    )
    group.addoption(
        "--check-collectives",
        action="store_true",
        default=False,
        help="check every job's collectives across ranks (torch's ProcessGroupWrapper; "
        "slower). Without it only a job that hung or broke a collective is "
        "replayed with checking, and the rest of its check runs checked",
    )
    group.addoption(
        "--allow-oversubscribe",
        action="store_true",
        default=False,
        help=f"start --nproc ranks even beyond {resources.RANKS_PER_CORE} CPU ranks per core "
        "or the memory available (refused by default)",
    )
    inplay.remember_options(group)


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker, refuse xdist; in a run that uses the harness, :func:`start` it."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*sizes): world sizes the test runs at; skipped when a size exceeds "
        "--nproc. A test taking a `world_size` argument is parametrized over the sizes.",
    )
    refuse_xdist(config)
    if config.option.help or config.option.version:
        return
    if inplay.wanted(config):
        inplay.activate(config)


def start(config: pytest.Config, pytest_session: pytest.Session | None = None) -> None:
    """Check the options, make the harness session and register its plugin; warm it up.

    Called once per run by :func:`harness.entry.inplay.activate`: from ``pytest_configure``, or
    during collection (``pytest_session`` then is the running session).
    """
    import harness.torch_compat as torch_compat
    from harness.config import HarnessConfig, default_nproc, resolve_backend, strategy_factory
    from harness.contract import StrategyFactoryError, load_factory, parse_strategy_options
    from harness.run.session import SESSION_PLUGIN, HarnessSession
    from harness.run.sessionplugin import SessionPlugin
    from harness.wire.attach import AttachError, info_from_env

    strategy = strategy_factory(config.getoption("strategy"))
    try:
        torch_compat.check_torch_version()  # before any rank starts: one line, exit 4
        load_factory(strategy)
        options = parse_strategy_options(config.getoption("strategy_option"))
        attach = info_from_env()
        nproc = config.getoption("nproc")
        if nproc is None:
            nproc = attach.world_size if attach is not None else default_nproc()
        if attach is None and not config.getoption("allow_oversubscribe"):
            backend = resolve_backend(config.getoption("backend"), nproc)
            resources.check_world_size(nproc, backend)
        settings = HarnessConfig(
            nproc=nproc,
            backend=config.getoption("backend"),
            rank_timeout=config.getoption("rank_timeout"),
            strategy=strategy,
            strategy_options=options,
            transport="local" if attach is None else "torchrun",
            attach=attach,
            shared_dir=config.getoption("shared_dir"),
            check_collectives=config.getoption("check_collectives"),
        )
        session = HarnessSession(settings)
    except (StrategyFactoryError, ValueError, AttachError) as exc:
        raise pytest.UsageError(str(exc)) from None
    plugin = SessionPlugin(session)
    plugin.pytest_session = pytest_session
    config.pluginmanager.register(plugin, SESSION_PLUGIN)
    sigterm.install()
    if not config.option.collectonly:
        session.warm_up()


def refuse_xdist(config: Any) -> None:
    """Raise a usage error under pytest-xdist: the ranks already are the parallelism."""
    workers = getattr(config.option, "numprocesses", None)
    if workers or hasattr(config, "workerinput"):
        raise pytest.UsageError(
            f"shardcheck cannot run under pytest-xdist (-n {workers or '?'}): each test "
            "already runs on a pool of rank processes. Drop -n; set the number of ranks "
            "with --nproc."
        )


def pytest_report_header(config: pytest.Config) -> str | None:
    """One header line with the session's harness settings (none before the harness starts)."""
    if not inplay.is_active(config):
        return None
    from harness.config import describe_backends
    from harness.run.session import session_of

    cfg = session_of(config).config
    backends = ""
    if cfg.backend == "auto" and cfg.attach is None:
        backends = f" ({describe_backends('auto', cfg.world_sizes())})"
    mode = ""
    if cfg.attach is not None:
        mode = f" attach=torchrun({cfg.attach.nnodes} node(s) x {cfg.attach.local_world_size})"
    return (
        f"shardcheck: nproc={cfg.nproc}{mode} backend={cfg.backend}{backends} "
        f"rank-timeout={cfg.rank_timeout:g}s strategy={cfg.strategy}"
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Keep the pytest session, for a harness that starts during collection."""
    inplay.remember_session(session)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Start the harness once a collected test module has imported it."""
    if not inplay.is_active(item.config) and inplay.newly_imported(item.config):
        inplay.activate(item.config)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A SIGTERM whose exception was swallowed stops the session before the next test."""
    sigterm.raise_if_terminated()


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """The interrupt (Ctrl-C or SIGTERM) reached pytest: nothing to raise again."""
    sigterm.delivered()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Restore the SIGTERM handler (the session plugin has stopped every pool by now)."""
    sigterm.uninstall()


def marker_sizes(marker: pytest.Mark) -> list[int]:
    """The world sizes a ``world_size`` marker declares, checked."""
    sizes = list(marker.args)
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(
            f"@pytest.mark.world_size{tuple(sizes)!r}: give one or more positive ints, "
            "for example @pytest.mark.world_size(2, 4)."
        )
    return sizes


def _too_big(config: pytest.Config, size: int) -> str | None:
    from harness.run.session import session_of

    inplay.activate(config)  # a world_size marker uses the harness
    return session_of(config).unavailable_reason(size)


def _parametrized(metafunc: pytest.Metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        names = names.split(",") if isinstance(names, str) else names
        if name in [n.strip() for n in names]:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize a ``world_size`` argument over the marker's sizes (too big ones skip)."""
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None or MARKER not in metafunc.fixturenames or _parametrized(metafunc, MARKER):
        return
    params = []
    for size in marker_sizes(marker):
        reason = _too_big(metafunc.config, size)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(size, id=f"ws{size}", marks=marks))
    metafunc.parametrize(MARKER, params)


def _scaled_timeout(config: pytest.Config) -> float | None:
    """The test timeout for a Hypothesis test under the active profile: the configured one
    (pytest-timeout's ``timeout``) times the profile's examples over ``ci``'s, so a check
    that fits under ``ci`` fits under ``dev`` and ``nightly`` too; None without a timeout."""
    if "hypothesis" not in sys.modules:
        return None  # no test module imported it: no Hypothesis test
    from hypothesis import settings

    try:
        base = float(config.getini("timeout") or 0)
    except (ValueError, KeyError):  # no pytest-timeout, or a value it would refuse too
        return None
    if base <= 0:
        return None
    return base * max(1.0, settings().max_examples / PROFILE_EXAMPLES["ci"])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests whose declared world size exceeds --nproc as skipped, saying why; give a
    Hypothesis test without a timeout of its own one scaled to the profile's examples."""
    scaled = _scaled_timeout(config)
    for item in items:
        function = getattr(item, "obj", None)
        if scaled is not None and getattr(function, "is_hypothesis_test", False):
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(scaled))
        marker = item.get_closest_marker(MARKER)
        if marker is None:
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is not None and MARKER in callspec.params:
            continue  # parametrized by pytest_generate_tests, which marks too-big sizes
        reasons = [r for r in (_too_big(config, n) for n in marker_sizes(marker)) if r]
        if reasons:
            item.add_marker(pytest.mark.skip(reason=reasons[-1]))
