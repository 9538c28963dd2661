"""One harness session: the settings in force, the pools, job ids and what the run learned.

[Note: the session object] Everything one run of the harness holds lives on one
:class:`HarnessSession`: the settings (:class:`~harness.config.HarnessConfig`), one
:class:`~harness.pool.rankpool.RankPool` per world size, the temporary directory, job ids, the
deadlines learned per check, which check runs with collective checking, where job output goes,
the rank warnings counted, the late violations the ranks reported, the refusals met
(:mod:`harness.refusals`) and the observer of the running check (the conformance plugin's).
The pytest plugin makes one per pytest session and registers it, wrapped in its hooks, as the
plugin ``shardcheck-session`` (:class:`harness.plugin.SessionPlugin`); other plugins reach it
with ``config.pluginmanager.get_plugin(SESSION_PLUGIN).session``.

Code that runs inside a test (``run_on_ranks``, the suites' helpers) has no ``config`` at
hand: it reaches the session with :func:`current`, the top of a stack that
:func:`activate` and :func:`deactivate` keep (a stack, because pytester runs a pytest session
inside another). That stack is the only process-wide handle; scripts that use no plugin
(the benchmark) get a session with the default settings on first use.
"""

from __future__ import annotations

import itertools
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, NoReturn, Protocol

from harness.config import HarnessConfig, resolve_backend
from harness.pool.heals import Heal
from harness.pool.rankpool import RankPool
from harness.pool.transport import PoolSettings, TransportKind
from harness.pool.transports import loaded_kinds, transport_kind
from harness.pool.usage import PoolUsage
from harness.rank.runner import pg_timeout_for
from harness.refusals import Refusal, skip_exception
from harness.run.budget import TestBudget
from harness.run.deadlines import Deadlines, current_check
from harness.run.remembered import RememberedRefusals
from harness.verdicts.attribution import LateViolation
from harness.verdicts.outcomes import Outcome
from harness.verdicts.rankwarnings import RankWarnings

__all__ = [
    "SESSION_PLUGIN",
    "CheckObserver",
    "HarnessSession",
    "OutputSink",
    "activate",
    "current",
    "deactivate",
    "session_of",
]

#: the name the pytest plugin registers the session under
SESSION_PLUGIN = "shardcheck-session"

OutputSink = Callable[[Sequence[Outcome]], None]


class CheckObserver(Protocol):
    """What the running check wants to hear of (the conformance plugin sets one per test)."""

    def before_job(self) -> None:
        """A job is about to be dispatched (the shrink budget may end the search here)."""

    def job_ran(self) -> None:
        """A job came back from the ranks: an example did run."""

    def refused(self, refusal: Refusal) -> None:
        """An example was refused (may raise the check's skip when it gives up)."""

    def exercised(self, axes: Mapping[str, Sequence[str]]) -> None:
        """A job ran a configuration with these values on the main axes."""


class HarnessSession:
    """The state of one run of the harness (see [Note: the session object]).

    Args:
        config: the settings; checked here.

    Raises:
        ValueError: a setting is out of range (the message names it and the fix).
    """

    def __init__(self, config: HarnessConfig | None = None) -> None:
        self.config = config or HarnessConfig()
        self.config.check()
        self.transport()  # a transport no module registers is refused here (ValueError)
        self.pools: dict[int, RankPool] = {}
        self.root: str | None = None
        self._job_ids = itertools.count(1)
        self.last_job_id = 0
        self.deadlines = Deadlines(ceiling=self.config.rank_timeout)
        self.checked_check: str | None = None  # the check whose jobs run with checking
        #: the running test's time (see [Note: the test's time budget] in harness.run.budget)
        self.budget: TestBudget | None = None
        self.desync_seen = False  # a replay named a desync: every later job runs checked
        self.refusals: dict[str, Refusal] = {}  # the last refusal of each outcome
        self.remembered = RememberedRefusals()  # option values the strategy refused
        self.output_sink: OutputSink | None = None
        self.observer: CheckObserver | None = None
        self.warnings = RankWarnings()
        self.late: list[tuple[int, LateViolation]] = []  # (rank, violation) from jobs
        self.heals: list[Heal] = []  # restarts of the ranks, see [Note: heals are counted]
        #: what the ranks of each world size held, over every pool of the session
        self.usage: dict[int, PoolUsage] = {}
        #: why job cutoffs moved on while the ranks still worked, per world size
        self.cutoffs_moved: dict[int, list[str]] = {}
        #: the seconds of each switch of attach mode's ranks to a world size, by that size
        self.switches: dict[int, list[float]] = {}
        self.universe: set[tuple[str, str, str, str]] = set()  # declared configuration pairs
        self.costs: list[dict[str, Any]] = []  # what the cost checks measured, per configuration

    # -- settings -------------------------------------------------------------------------

    def configure(self, **changes: Any) -> HarnessConfig:
        """Change settings (see :class:`HarnessConfig`); running pools are stopped and what
        was learned about deadlines is forgotten.

        Raises:
            ValueError: a value is out of range (the message names it and the fix).
        """
        new = replace(self.config, **changes)
        new.check()
        transport_kind(new.transport)  # a transport no module registers is refused here
        self.shutdown()
        self.config = new
        self.deadlines = Deadlines(ceiling=new.rank_timeout)
        self.checked_check = None
        self.desync_seen = False
        return new

    def unavailable_reason(self, world_size: int) -> str | None:
        """Why ``world_size`` cannot run in this session (``environment: ...``), or ``None``."""
        return self.config.unavailable_reason(world_size)

    # -- pools ----------------------------------------------------------------------------

    def lost_reason(self) -> str | None:
        """Why the run cannot go on (in attach mode, a rank is gone), else ``None``."""
        for pool in self.pools.values():
            if pool.lost:
                return pool.lost
        return None

    def world_sizes_used(self) -> list[int]:
        """The world sizes this session made pools for, smallest first."""
        return sorted(self.pools)

    def next_job_id(self) -> int:
        """A new job id (the session's jobs are numbered from 1)."""
        self.last_job_id = next(self._job_ids)
        return self.last_job_id

    def session_root(self) -> str:
        """The session's temporary directory (job files), made on first use."""
        if self.root is None:
            self.root = tempfile.mkdtemp(prefix="shardcheck-", dir=self.config.shared_dir)
        return self.root

    def transport(self) -> TransportKind:
        """The transport the settings name (:mod:`harness.pool.transports`)."""
        return transport_kind(self.config.transport)

    def pool_for(self, world_size: int) -> RankPool:
        """The pool for ``world_size`` (created, not started, on first use), over the
        session's transport."""
        pool = self.pools.get(world_size)
        if pool is not None:
            return pool
        kind = self.transport()
        backend = resolve_backend(self.config.backend, kind.gpu_ranks(self.config, world_size))
        settings = PoolSettings(
            world_size=world_size,
            backend=backend,
            pg_timeout=pg_timeout_for(self.config.rank_timeout),
            threads=self.config.threads,
            failure_grace=self.config.failure_grace,
            check_collectives=self.config.check_collectives,
            rank_timeout=self.config.rank_timeout,
        )
        transport = kind.open(self.config, world_size, self.session_root())
        pool = self.pools[world_size] = RankPool(settings, transport)
        pool.usage = self.usage.setdefault(world_size, PoolUsage())
        pool.cutoffs_moved = self.cutoffs_moved.setdefault(world_size, [])
        pool.switches = self.switches.setdefault(world_size, [])
        return pool

    def warm_up(self) -> None:
        """Let the transport prepare the first pool in the background (the local one starts
        its forkserver, which imports torch while pytest collects)."""
        self.transport().warm_up(self.config)

    def shutdown(self, final: bool = False) -> None:
        """Stop every pool (no rank process is left) and remove the temporary files.

        Args:
            final: also stop what the transport keeps for the whole session (the local
                transport's forkserver): at the session's end.
        """
        pools = list(self.pools.values())
        self.pools.clear()
        for pool in pools:
            pool.stop()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
        if final:
            self.transport().stop()

    # -- refusals and the running check ---------------------------------------------------

    def refuse(self, refusal: Refusal) -> NoReturn:
        """The one path of a refusal (see [Note: refusals] in :mod:`harness.refusals`):
        record it, then reject the example (inside Hypothesis) or skip the test.

        Raises:
            hypothesis.errors.UnsatisfiedAssumption: inside a Hypothesis example.
            pytest.skip.Exception: outside one, or when the running check gives up (every
                example it tried was refused).
        """
        self.record_refusal(refusal)
        hypothesis = sys.modules.get("hypothesis")  # only a test that imported it is inside it
        if hypothesis is not None and hypothesis.currently_in_test_context():
            try:
                hypothesis.reject()
            except BaseException as rejection:
                # caused by the refusal, recorded here: the check's wrapper, which records a
                # suite's own reject() of an Unsupported, does not record it again
                raise rejection from refusal
        raise skip_exception(refusal.describe()) from None

    def record_refusal(self, refusal: Refusal) -> None:
        """Keep ``refusal`` as the last of its outcome and tell the running check's observer."""
        self.refusals[refusal.outcome] = refusal
        if self.observer is not None:
            self.observer.refused(refusal)

    def take_refusal(self, outcome: str) -> Refusal | None:
        """The last refusal of ``outcome`` recorded (then forgotten), if any."""
        return self.refusals.pop(outcome, None)

    def forget_refusals(self) -> None:
        """Forget the refusals recorded so far (a test starts)."""
        self.refusals.clear()

    @contextmanager
    def observing(self, observer: CheckObserver) -> Iterator[None]:
        """Let ``observer`` hear of the jobs and refusals of the ``with`` body."""
        previous, self.observer = self.observer, observer
        try:
            yield
        finally:
            self.observer = previous

    def job_ran(self) -> None:
        """A job of the running check came back from the ranks, passed or failed (not
        refused): an example ran (:func:`harness.run.jobs.run_on_ranks` calls this)."""
        if self.observer is not None:
            self.observer.job_ran()

    def note_exercised(self, axes: Mapping[str, Sequence[str]]) -> None:
        """A job of the running check ran (pass or fail) a configuration with these values on
        the main axes (the suites' dispatch calls this; the coverage table counts them)."""
        if self.observer is not None:
            self.observer.exercised(axes)

    def note_universe(self, pairs: Iterable[tuple[str, str, str, str]]) -> None:
        """Declare pairs of the configuration space, ``(axis, value, other axis, value)``:
        the coverage table counts them and lists those no job reached (a suite's pairwise
        cover declares the space it covers)."""
        self.universe.update(pairs)

    def note_cost(self, measured: Mapping[str, Any]) -> None:
        """Keep one configuration's cost measurement (the cost checks call this once per
        configuration): ``configuration``, ``family``, ``world_size`` and every rank's bytes
        (``ranks``); the report carries them in ``cost``."""
        self.costs.append(dict(measured))

    # -- what jobs leave behind -----------------------------------------------------------

    def publish(self, outcomes: Sequence[Outcome]) -> None:
        """Publish one job's outcomes: their warnings are counted for the run's summary,
        late violations kept for the conformance plugin, and stdout/stderr go to the output
        sink (the test's report sections) or, with no sink, to this process's streams, each
        line prefixed with its rank."""
        self.warnings.add(outcomes)
        self.late.extend((o.rank, v) for o in outcomes for v in o.late)
        if not any(o.stdout or o.stderr or o.warnings for o in outcomes):
            return
        if self.output_sink is not None:
            self.output_sink(outcomes)  # warnings: counted for the summary instead
            return
        for o in outcomes:
            for text, stream in ((o.stdout, sys.stdout), (o.stderr + o.warnings, sys.stderr)):
                for line in text.splitlines():
                    print(f"[rank {o.rank}] {line}", file=stream)

    def note_heals(self, pool: RankPool, world_size: int) -> None:
        """Keep the heals ``pool`` made since it was last asked, with the running check."""
        check = current_check("(outside a test)")
        self.heals += [Heal(world_size, cause, check) for cause in pool.take_heals()]

    def take_late(self) -> list[tuple[int, LateViolation]]:
        """The late violations reported since the last call, as ``(rank, violation)``."""
        taken, self.late = self.late, []
        return taken


# The only process-wide handle (see [Note: the session object]): the sessions in force, the
# innermost last. Not session state itself: each session keeps its own.
_ACTIVE: list[HarnessSession] = []


def current() -> HarnessSession:
    """The session in force: the innermost active one, or a default one made on first use."""
    if not _ACTIVE:
        _ACTIVE.append(HarnessSession())
    return _ACTIVE[-1]


def session_of(config: Any) -> HarnessSession:
    """The harness session of a pytest ``config``: the one the pool plugin registered as
    :data:`SESSION_PLUGIN`, or (the pool plugin not loaded) :func:`current`."""
    manager = getattr(config, "pluginmanager", None)
    plugin = manager.get_plugin(SESSION_PLUGIN) if manager is not None else None
    session = getattr(plugin, "session", None)
    return session if isinstance(session, HarnessSession) else current()


def activate(session: HarnessSession) -> None:
    """Make ``session`` the one :func:`current` returns until :func:`deactivate`."""
    _ACTIVE.append(session)


def deactivate(session: HarnessSession) -> None:
    """Stop ``session`` (pools, temporary files) and take it off the stack."""
    session.shutdown()
    if session in _ACTIVE:
        _ACTIVE.remove(session)


def shutdown_all() -> None:
    """Stop every active session's pools and whatever the transports keep (the
    forkserver), at interpreter exit."""
    for session in list(_ACTIVE):
        session.shutdown()
    for kind in loaded_kinds():
        kind.stop()
