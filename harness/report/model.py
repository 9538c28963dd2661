"""The report model: checks, outcomes, clauses, and the ``report.json`` document."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.clauses import CLAUSES, FAMILIES
from harness.report.outcome import CHECK_OUTCOMES, Outcome, worst

__all__ = [
    "BLOCKED",
    "CONFORMING",
    "CONFORMING_OFFERED",
    "FAILED_WITH",
    "LISTED_PREFIX",
    "NOT_APPLICABLE",
    "NOT_RUN",
    "NO_CLAUSE",
    "OUTCOMES",
    "READABLE_SCHEMAS",
    "SCHEMA_VERSION",
    "SEVERITY",
    "XPASS_PREFIX",
    "CheckResult",
    "FindingResult",
    "Report",
    "ReportError",
    "against",
    "applies",
    "clause_family_outcomes",
    "clause_outcomes",
    "declared_unsupported",
    "environment_note",
    "load_report",
    "nonconforming",
    "offered_outcome",
    "refused_families",
    "worst_outcome",
]

#: 2 added the ``not run``, ``desync``, ``hang`` and ``blocked`` outcomes, ``findings``, and
#: each check's ``finding``, ``attributed_to`` and ``family``; reports of schema 1 (a subset)
#: are still read.
SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
#: The outcome of a check the session never reached (interrupted, ``-x``, ``--maxfail``).
NOT_RUN = Outcome.NOT_RUN.value
#: A failure whose ranks entered different collectives
#: (``harness.verdicts.failures.CollectiveDesync``).
DESYNC = Outcome.DESYNC.value
#: A failure whose ranks waited inside the job (``harness.verdicts.failures.CollectiveHang``).
HANG = Outcome.HANG.value
#: A check whose property was never reached: another clause's violation came first.
BLOCKED = Outcome.BLOCKED.value
#: A clause's outcome, never a check's: the clause applies to none of the families the
#: strategy offers ([Note: not applicable]).
NOT_APPLICABLE = Outcome.NOT_APPLICABLE.value
#: The outcomes of a check, in the order reports list them (``desync`` and ``hang`` are
#: failures of their own kind).
OUTCOMES = tuple(o.value for o in CHECK_OUTCOMES)
#: Every outcome, a clause's ``not applicable`` included, worst first
#: (:attr:`Outcome.severity`): a clause takes the worst outcome of its checks.
SEVERITY = tuple(sorted((o.value for o in Outcome), key=lambda o: Outcome(o).severity))
#: Outcomes that do not fail a ``--conformance-strict`` run (:meth:`Outcome.conforms`).
CONFORMING = frozenset(o.value for o in Outcome if o.conforms(whole_space=True))
#: The same when the strategy need not offer the whole configuration space (the default): a
#: check whose every example the strategy declared ``Unsupported`` conforms (see
#: :func:`nonconforming`).
CONFORMING_OFFERED = frozenset(o.value for o in Outcome if o.conforms(whole_space=False))
NO_CLAUSE = "(no clause)"
#: How a listed check's xfail reason starts (``expected failure: <the file's reason>``), and
#: what joins it to the failure it met: an ``xfailed`` check's ``failure`` is
#: ``expected failure: <reason>; it failed with: <failure>``.
LISTED_PREFIX = "expected failure: "
FAILED_WITH = "; it failed with: "
#: How the ``failure`` of a listed check that passed starts (pytest's strict xpass): its outcome
#: is ``failed``, as it fails the run, but it is a fix, not a failure (:attr:`CheckResult.fixed`).
XPASS_PREFIX = "passed although listed as an expected failure"


class ReportError(ValueError):
    """A report file cannot be read: missing, not JSON, or not a shardcheck report."""


@dataclass
class CheckResult:
    """One check (one pytest test item) and what became of it.

    Args:
        id: the stable check id, ``<suite module>.<test>[<param id>]``.
        clauses: the CONTRACT.md clause ids the check declares.
        outcome: one of :data:`OUTCOMES`.
        duration_s: setup + call + teardown time in seconds.
        failure: why it did not pass (failure summary, skip reason, xfail reason); None if
            it passed.
        reproducer: a one-line command that reruns just this check.
        finding: the finding its failure belongs to (``failed``, ``blocked``, ``desync``,
            ``hang``), e.g. ``"F1"``.
        attributed_to: the clauses its failure broke (of its own clauses: the one its failing
            call or assertion named; ``blocked``: the other clause that blocked it); empty
            when the failure named none (then all of its clauses).
        family: ``fsdp`` or ``model_parallel`` when the check is about one family, else ``""``.
        rank_jobs: the rank jobs it dispatched (its examples and their shrinking).
        unsupported: the configurations the strategy declared unsupported while the check
            ran (``unsupported: option=value (reason)``), each once; a check that passed may
            have some (the examples that could run passed).
    """

    id: str
    clauses: list[str]
    outcome: str
    duration_s: float = 0.0
    failure: str | None = None
    reproducer: str = ""
    finding: str | None = None
    attributed_to: list[str] = field(default_factory=list)
    family: str = ""
    rank_jobs: int = 0
    unsupported: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(
                f"CheckResult.outcome={self.outcome!r} for check {self.id!r} is not an outcome; "
                f"use one of {', '.join(OUTCOMES)}."
            )

    @property
    def fixed(self) -> bool:
        """Whether the check passed although the expected-failures file lists it (a strict
        xpass): the run fails on it, but what it asks for is to take its line out."""
        return self.outcome == Outcome.FAILED and (self.failure or "").startswith(XPASS_PREFIX)

    @property
    def nonconforming(self) -> bool:
        """Whether the check did not conform: its outcome fails the run (a fixed check
        excepted) or it failed as listed (``xfailed``): what a baseline lists."""
        return Outcome(self.outcome).is_failure and not self.fixed

    def own_failure(self) -> str:
        """``failure`` without what a listing added: an ``xfailed`` check's text is the failure
        it met, not ``expected failure: <reason>; it failed with: ...`` (the reason may hold
        an earlier run's text; the failure itself comes last)."""
        text = self.failure or ""
        if self.outcome == Outcome.XFAILED and text.startswith(LISTED_PREFIX):
            _, found, rest = text.rpartition(FAILED_WITH)
            return rest if found else text.removeprefix(LISTED_PREFIX)
        return text

    def clause_outcome(self, clause: str) -> str:
        """This check's outcome for one of its clauses: a failure attributed to another of
        its clauses leaves this one ``blocked`` (not verified), not failed; a listed check that
        passed (:attr:`fixed`) reads ``passed``: its property held."""
        if self.fixed:
            return Outcome.PASSED.value
        failing = self.outcome in (Outcome.FAILED, Outcome.DESYNC, Outcome.HANG)
        if failing and self.attributed_to and clause not in self.attributed_to:
            return BLOCKED
        return self.outcome


@dataclass
class FindingResult:
    """One root cause found in the run.

    Args:
        id: ``F1``, ``F2``... in the order found.
        clauses: the clauses it breaks.
        signature: the grouping key (clause, exception type, masked message, location).
        message: the first failure's message, first line.
        where: ``file:line function`` where it was raised (outside shardcheck when known):
            for an exception raised in torch's code, the strategy's line that called it.
        checks: the checks it made fail or blocked (or, ``late``, was seen in).
        example: the failing example (Hypothesis' shrunk example), when there was one.
        reproduce: a command that reruns the check it was found in.
        late: recorded after its checks' properties were tested (their verdicts stand).
        found_after_s: seconds from the session's start until it was found.
        kind: what kind of failure it is (lost or corrupted data, a wrong result, a race
            between ranks, a hang or desync, a crash, leftover files, a refusal with the
            wrong exception, a convention); findings come worst kind first.
        raised_in: for an exception raised in torch's code, torch's frame where it was
            raised (``where`` is the strategy's line that called it); else ``""``.
    """

    id: str
    clauses: list[str]
    signature: str
    message: str
    where: str = ""
    checks: list[str] = field(default_factory=list)
    example: str = ""
    reproduce: str = ""
    late: bool = False
    found_after_s: float = 0.0
    kind: str = ""
    raised_in: str = ""


@dataclass
class Report:
    """A whole run: where it ran, which strategy, and every check.

    Args:
        suite_version: shardcheck's version.
        environment: torch, python, backend, device, world_sizes (and other facts).
        strategy: ``{"factory": "module:callable", "options": {...}}``.
        checks: every check that ran (or was meant to run), in run order.
        selection: how checks were selected: ``clauses`` (the ``--clauses`` value or None) and
            ``deselected`` (ids of checks that were collected but not run).
        expected_failures: ``file`` and ``unmatched`` (ids in it that matched no test).
        findings: the failures grouped by root cause.
        coverage: the pairs of configuration-axis values the checks exercised
            (:func:`harness.conformance.output.coverage.coverage_of`; empty when none reported).
        run: how and when the run ran: ``hypothesis_profile``, ``hypothesis_seed``
            (``--hypothesis-seed``, or None), ``started_at`` (UTC, ISO 8601) and
            ``wall_time_s`` (empty in reports written before these were recorded).
        cost: what the cost checks measured (:func:`harness.report.cost.cost_of`: per
            configuration and world size, every rank's bytes at rest and at the peak by
            category and the collectives of a step by kind; the per-rank law with its
            projection); empty when no cost check ran.
    """

    suite_version: str
    environment: dict[str, Any]
    strategy: dict[str, Any]
    checks: list[CheckResult]
    selection: dict[str, Any] = field(default_factory=dict)
    expected_failures: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    findings: list[FindingResult] = field(default_factory=list)
    coverage: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """The number of checks per outcome (every outcome present, zeros included)."""
        counts = dict.fromkeys(OUTCOMES, 0)
        for check in self.checks:
            counts[check.outcome] += 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """The ``report.json`` document."""
        return {
            "schema_version": self.schema_version,
            "suite_version": self.suite_version,
            "environment": self.environment,
            "strategy": self.strategy,
            "run": self.run,
            "counts": self.counts(),
            "clauses": {
                c: outcome
                for c, (outcome, _) in clause_outcomes(self.checks, self.findings).items()
            },
            "clauses_by_family": clause_family_outcomes(self.checks, self.findings),
            "selection": self.selection,
            "expected_failures": self.expected_failures,
            "findings": [asdict(finding) for finding in self.findings],
            "coverage": self.coverage,
            "cost": self.cost,
            "checks": [asdict(check) for check in self.checks],
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> Report:
        """Rebuild a report from its JSON document.

        Raises:
            ReportError: the document is not a shardcheck report of a known schema version.
        """
        if not isinstance(data, dict) or "checks" not in data or "schema_version" not in data:
            raise ReportError(
                f"{source} is not a shardcheck report (no 'schema_version'/'checks'); "
                "pass the report.json written by --conformance-report."
            )
        if data["schema_version"] not in READABLE_SCHEMAS:
            readable = " or ".join(map(str, READABLE_SCHEMAS))
            raise ReportError(
                f"{source} has schema_version={data['schema_version']!r}; this shardcheck "
                f"reads schema_version={readable}. Compare reports of a readable schema."
            )
        keys = ("id", "clauses", "outcome", "duration_s", "failure", "reproducer")
        optional = ("finding", "attributed_to", "family", "rank_jobs", "unsupported")
        try:
            checks = [
                CheckResult(**{k: c[k] for k in keys}, **{k: c[k] for k in optional if k in c})
                for c in data["checks"]
            ]
            findings = [FindingResult(**f) for f in data.get("findings", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise ReportError(f"{source}: a check or finding entry is malformed ({exc}).") from exc
        return cls(
            suite_version=data.get("suite_version", "0+unknown"),
            environment=data.get("environment", {}),
            strategy=data.get("strategy", {}),
            checks=checks,
            selection=data.get("selection", {}),
            expected_failures=data.get("expected_failures", {}),
            schema_version=data["schema_version"],
            findings=findings,
            coverage=data.get("coverage", {}),
            run=data.get("run", {}),
            cost=data.get("cost", {}),
        )


def worst_outcome(outcomes: Iterable[str]) -> str:
    """The worst of ``outcomes`` in the order of :data:`SEVERITY` (``passed`` if empty)."""
    return worst(outcomes).value


def offered_outcome(outcomes: Iterable[str]) -> str:
    """A clause's outcome from its checks' ``outcomes``: the worst of those that count against
    a clause (:attr:`Outcome.counts_against_clause`); when none does, ``passed`` if a check
    passed (checks the strategy declared ``unsupported`` and checks that need another
    ``environment`` do not count against checks that ran and passed; see [Note: a strategy
    that offers a subset]), else the worst of the rest."""
    present = [Outcome(o) for o in outcomes]
    against = [o for o in present if o.counts_against_clause]
    if against:
        return worst(against).value
    if Outcome.PASSED in present:
        return Outcome.PASSED.value
    return worst(present).value


def declared_unsupported(checks: Iterable[CheckResult], reasons: bool = True) -> list[str]:
    """The configurations ``checks`` met declared unsupported, each ``option=value`` once
    (with the first reason given for it, unless ``reasons`` is false): from the checks whose
    every example was refused and from the refused examples of checks that ran."""
    seen: dict[str, str] = {}
    for check in checks:
        found = list(check.unsupported)
        if check.outcome == "unsupported" and check.failure:
            found.append(check.failure.strip().splitlines()[0])
        for description in found:
            text = description.removeprefix("unsupported: ").strip()
            for part in text.split("; "):
                key = part.split(" (", 1)[0]
                seen.setdefault(key, part)
    return [seen[k] if reasons else k for k in sorted(seen)]


def nonconforming(checks: Iterable[CheckResult], whole_space: bool = False) -> list[CheckResult]:
    """The checks that fail a ``--conformance-strict`` run.

    [Note: a strategy that offers a subset] A strategy may implement part of the
    configuration space and raise ``Unsupported`` for the rest. By default it conforms when
    every check it could run passed (or failed as the expected-failures file lists: an
    ``xfailed`` check ran, so it was offered): a check whose every example it refused is
    ``unsupported``, not a failure, and a clause with a passed check and unsupported ones is
    passed (the report lists the values it declared unsupported). A strategy that refused
    every check offered nothing to check, so it does not conform. With ``whole_space``
    (``--require-whole-space``) an ``unsupported`` check fails the run too.

    Args:
        checks: the run's checks.
        whole_space: whether the strategy must offer every configuration.
    """
    chosen = list(checks)
    bad = [c for c in chosen if not Outcome(c.outcome).conforms(whole_space)]
    refused = [c for c in chosen if c.outcome == Outcome.UNSUPPORTED]
    if not whole_space and refused and not any(Outcome(c.outcome).offered for c in chosen):
        return refused  # it refused everything it was asked: nothing conformed
    return bad


def _finding_outcome(hit: Sequence[CheckResult]) -> str:
    """What a finding makes of a clause it breaks: ``desync`` or ``hang`` when its checks
    were, ``xfailed`` when every one of them failed as the expected-failures file lists, else
    ``failed``."""
    kinds = {c.outcome for c in hit} & {DESYNC, HANG}
    if kinds:
        return min(kinds)
    if all(c.outcome == Outcome.XFAILED for c in hit):
        return Outcome.XFAILED.value
    return Outcome.FAILED.value


def _grouped(
    checks: Sequence[CheckResult],
    findings: Sequence[FindingResult],
    families: Collection[str] | None = None,
) -> dict[str, tuple[list[str], list[CheckResult]]]:
    """``{clause: (the outcomes it counts, its checks)}`` over the checks of ``families``
    (``""``: of no one family; None: every check), clauses sorted: a check counts for each
    clause it declares with :meth:`CheckResult.clause_outcome`; a finding counts for each
    clause it breaks (one the failing checks do not declare, such as the one that blocked
    them or one violated late, included), over its checks kept."""
    chosen = [c for c in checks if families is None or c.family in families]
    groups: dict[str, list[CheckResult]] = {}
    outcomes: dict[str, list[str]] = {}
    for check in chosen:
        for clause in check.clauses or [NO_CLAUSE]:
            groups.setdefault(clause, []).append(check)
            outcomes.setdefault(clause, []).append(check.clause_outcome(clause))
    by_id = {c.id: c for c in chosen}
    for finding in findings:
        hit = [by_id[i] for i in finding.checks if i in by_id]
        if not hit:
            continue
        for clause in finding.clauses:
            groups.setdefault(clause, [])
            groups[clause] += [c for c in hit if c not in groups[clause]]
            outcomes.setdefault(clause, []).append(_finding_outcome(hit))
    return {clause: (outcomes.get(clause, []), groups[clause]) for clause in sorted(groups)}


def clause_outcomes(
    checks: Sequence[CheckResult],
    findings: Sequence[FindingResult] = (),
    family: str | None = None,
) -> dict[str, tuple[str, list[CheckResult]]]:
    """Group checks by clause: ``{clause: (its outcome, its checks)}``, clauses sorted, each
    outcome by the rule of [Note: one meaning in the clause table]: a clause with family
    cells (:func:`clause_family_outcomes`) is its cells put together, with its checks of no
    one family; any other is its checks put together (:func:`offered_outcome`).

    Args:
        checks: the checks.
        findings: the run's findings.
        family: only checks of this family, when given (their outcomes put together as
            they are: no cells).
    """
    if family is not None:
        own = _grouped(checks, findings, (family,))
        return {cl: (offered_outcome(outcomes), members) for cl, (outcomes, members) in own.items()}
    cells = clause_family_outcomes(checks, findings)
    familyless = _grouped(checks, findings, ("",))
    refused = refused_families(checks)
    table = {}
    for clause, (outcomes, members) in _grouped(checks, findings).items():
        if clause in cells:
            outcomes = [*cells[clause].values(), *familyless.get(clause, ([], []))[0]]
        table[clause] = (_applicable(offered_outcome(outcomes), applies(clause, refused)), members)
    return table


#: The outcomes that say the strategy broke a clause (or the suite broke on the way): they
#: stand even where the clause does not apply to what the strategy offers.
_VIOLATIONS = frozenset(
    o.value for o in (Outcome.FAILED, Outcome.DESYNC, Outcome.HANG, Outcome.ERROR, Outcome.XFAILED)
)


def _applicable(outcome: str, applicable: bool) -> str:
    """``outcome``, or ``not applicable`` where the clause (or cell) does not apply and its
    checks found no violation ([Note: not applicable])."""
    return outcome if applicable or outcome in _VIOLATIONS else NOT_APPLICABLE


def refused_families(checks: Iterable[CheckResult]) -> frozenset[str]:
    """The families the strategy does not offer, as far as ``checks`` tell: each one it
    declared unsupported as a whole (``family=fsdp``, an ``Unsupported`` naming the option
    ``family``) and no check of which ran. Empty when that is every family (a strategy that
    offered nothing to check: its clauses keep their outcomes, see [Note: a strategy that
    offers a subset]).

    [Note: not applicable] A clause says which families it applies to (its scope's
    ``family`` axis, :attr:`harness.clauses.Clause.families`; CONTRACT.md's families column).
    When the strategy offers none of them, the clause asks nothing of it: the clause reads
    ``not applicable`` (not ``unsupported``, ``passed`` or ``blocked``), and so does a family
    cell of a family the clause does not apply to, unless a check found a violation there
    (``failed``, ``desync``, ``hang``, ``xfailed``) or broke (``error``): those stand. What the
    strategy offers is known from what it declared: a family is not offered when the strategy
    refused it as a whole (``Unsupported(reason, "family", value)``, listed by
    :func:`declared_unsupported` as ``family=value``) and no check of it ran. A strategy that
    refuses a family without naming the option leaves it unknown, and the clauses keep their
    outcome (``unsupported``). A ``not applicable`` clause does not count against the run: it
    conforms, and it is never a check's outcome.
    """
    chosen = list(checks)
    declared = {
        key.removeprefix("family=")
        for key in declared_unsupported(chosen, reasons=False)
        if key.startswith("family=")
    }
    ran = {c.family for c in chosen if c.family and not Outcome(c.outcome).did_not_run}
    refused = frozenset(f for f in FAMILIES if f in declared and f not in ran)
    return refused if len(refused) < len(FAMILIES) else frozenset()


def applies(clause: str, refused: Collection[str]) -> bool:
    """Whether ``clause`` applies to a family not in ``refused`` (:func:`refused_families`);
    a clause the contract does not have applies to every family."""
    known = CLAUSES.get(clause)
    families = known.families if known is not None else FAMILIES
    return any(f not in refused for f in families)


def against(clause: str, members: Iterable[CheckResult]) -> list[CheckResult]:
    """The checks of ``clause`` whose outcome counts against it
    (:attr:`Outcome.counts_against_clause`), worst first, then in run order: the first is the
    one that decided the clause's outcome."""
    bad = [c for c in members if Outcome(c.clause_outcome(clause)).counts_against_clause]
    return sorted(bad, key=lambda c: Outcome(c.clause_outcome(clause)).severity)


def environment_note(clause: str, members: Iterable[CheckResult]) -> str:
    """`` (N environment)`` when checks of ``clause`` need another environment, else ``""``:
    a clause that passed says so beside its name."""
    count = sum(c.clause_outcome(clause) == Outcome.ENVIRONMENT for c in members)
    return f" ({count} environment)" if count else ""


def clause_family_outcomes(
    checks: Sequence[CheckResult], findings: Sequence[FindingResult] = ()
) -> dict[str, dict[str, str]]:
    """``{clause: {family: outcome}}``: the family cells of the clause table, for each clause
    some check of which names a family (fsdp, fsdp2, model_parallel), by the rule of
    [Note: one meaning in the clause table]. A clause none of whose checks names a family has
    no entry.

    [Note: one meaning in the clause table] Outcomes are put together one way everywhere
    (:func:`offered_outcome`): the worst of those that count against a clause; when none
    does, ``passed`` if one passed, else the worst of the rest. A family is *offered* when
    some check of it is not ``unsupported``. A clause's cell for a family puts together that
    family's checks of the clause and, where the strategy offers the family, the clause's
    checks of no one family (a check that draws its family ran on the families offered, so
    on any of them); a family not offered reads ``unsupported`` where the clause has checks of
    it. The clause's outcome puts together its cells and its checks of no one family. So the
    two agree: a clause is ``failed`` exactly when one of its cells is (or, where it has no
    cell of an offered family, a check of no one family failed), and a clause reads
    ``passed`` beside an ``unsupported`` cell when it passed on the families offered. A
    cell of a family the clause does not apply to, and a clause that applies to none of the
    families offered, read ``not applicable`` ([Note: not applicable]).
    """
    families = sorted({c.family for c in checks if c.family})
    split = {cl for c in checks if c.family for cl in c.clauses}
    offered = {
        f
        for f in families
        if any(c.outcome != Outcome.UNSUPPORTED for c in checks if c.family == f)
    }
    table: dict[str, dict[str, str]] = {}
    for family in families:
        kept = (family, "") if family in offered else (family,)
        cell = _grouped(checks, findings, kept)
        for clause, (outcomes, members) in cell.items():
            own = any(c.family == family for c in members)
            if clause not in split or not (own or family in offered):
                continue
            value = offered_outcome(outcomes) if family in offered else Outcome.UNSUPPORTED.value
            known = CLAUSES.get(clause)
            in_scope = known is None or family in known.families
            table.setdefault(clause, {})[family] = _applicable(value, in_scope)
    return dict(sorted(table.items()))


def load_report(path: str | Path) -> Report:
    """Read a ``report.json``.

    Raises:
        ReportError: the file is missing, not JSON, or not a shardcheck report.
    """
    file = Path(path)
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError as exc:
        raise ReportError(f"report file {str(file)!r} does not exist.") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"report file {str(file)!r} is not readable JSON ({exc}).") from exc
    return Report.from_dict(data, source=str(file))
