"""Findings: failures grouped by root cause, each under the clause it breaks.

Checks that failed with the same signature (:mod:`harness.conformance.findings.signatures`)
share one finding; so does the same error raised at the same place in checks of different
clauses (an untagged one; a tagged one joins under the first finding's clause: [Note: one
cause, one finding] in :mod:`harness.conformance.findings.one_cause`), and the same wrong
nested value reported by checks of different clauses (the finding then lists each clause). A
check whose failure was met looking through a method a finding already explains is
``blocked`` by it ([Note: looking through]). The report leads with the findings, each with
the clause's text, its example and a reproducer, and the checks it affected.

[Note: clause isolation] (in :mod:`harness.verdicts.attribution`) says how a failure gets its
clause: a check failing under a clause it does not declare is ``blocked`` by that clause.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from harness.conformance.findings.one_cause import same_raise
from harness.conformance.findings.signatures import Attribution
from harness.verdicts.attribution import TRAINING_METHODS, method_clause

__all__ = ["KINDS", "Finding", "Findings", "failure_kind", "kind_order"]

#: what kind of failure a finding is, worst first: the order the summary lists findings in
#: (what corrupts training or checkpoints before what breaks a convention of the contract)
KINDS = (
    "lost or corrupted data",
    "wrong result",
    "cost",
    "race between ranks",
    "hang or desync",
    "crash",
    "leftover files",
    "refusal with the wrong exception",
    "convention",
)
#: clauses about what a checkpoint holds: a wrong value there is lost or corrupted data
_DATA_CLAUSES = re.compile(r"^CKPT-(?:RT|SAVE-7|STRICT-3|BUF|REKEY|TRAINER)")
#: clauses about memory held and collectives issued: a right result at the wrong cost
_COST_CLAUSES = re.compile(r"^(?:MEM|COMM)-")
#: clauses about numbers computed in training: a wrong value there is a wrong result
_RESULT_CLAUSES = re.compile(r"^(?:TRAIN|CLIP|SYNC|SHARD|PREC|INIT|AC|MP-2|MP-4)")
_RACE = re.compile(r"(?:differ|not the same) (?:between|across|on every) ranks|on one rank only")
_DESYNC = re.compile(r"mismatch between collectives|collectives that do not match|desync")
_LEFTOVER = re.compile(r"directory held|left (?:behind|beside)|partial")
_REFUSAL = re.compile(r"nothing was raised|; expected \w+")
#: a checkpoint that holds the right data in another layout (an optimizer keyed by parameter
#: names where the trainer layout wants torch's integer ids: torch's own loader still maps
#: it by position), a convention of the contract, not lost data
_LAYOUT = re.compile(r"not in the standard form")


def failure_kind(attribution: Attribution, clauses: list[str]) -> str:
    """The kind of failure (one of :data:`KINDS`) a finding's first failure is."""
    message = attribution.message
    if attribution.kind == "hung" or _DESYNC.search(message):
        return "hang or desync"
    if attribution.kind == "crashed":
        return "crash"
    if _RACE.search(message):
        return "race between ranks"
    if attribution.kind == "assertion" and clauses and all(_COST_CLAUSES.match(c) for c in clauses):
        return "cost"
    data = any(_DATA_CLAUSES.match(c) for c in clauses)
    if attribution.kind == "raised":
        # a checkpoint that does not save or load back (or leaves state the next step fails
        # on) is lost; elsewhere the strategy's (or torch's) code raised where it should
        # have worked
        return "lost or corrupted data" if data else "crash"
    if _LEFTOVER.search(message) and "CKPT-SAVE-6" in clauses:
        return "leftover files"
    if _REFUSAL.search(message):
        return "refusal with the wrong exception"
    if _LAYOUT.search(message):
        return "convention"
    if data or "CKPT-SAVE-6" in clauses:
        return "lost or corrupted data"
    if any(_RESULT_CLAUSES.match(c) for c in clauses):
        return "wrong result"
    return "convention"


def kind_order(kind: str) -> int:
    """The sort key of a kind: its place in :data:`KINDS` (an unknown kind last)."""
    return KINDS.index(kind) if kind in KINDS else len(KINDS)


@dataclass
class Finding:
    """One root cause: its signature, the clauses it breaks, and the checks it affected.

    Args:
        id: ``F1``, ``F2``... in the order they were found.
        signature: the grouping key.
        clauses: the clauses it is attributed to.
        attribution: the first failure's attribution.
        checks: ids of the checks it made fail, blocked, or (late) was seen in.
        first_check: the check it was found (and shrunk) in.
        late: it was recorded after the checks' properties: their verdicts stand.
        seen_late: some check met it after its property (it may have failed another check,
            its own clause's, first).
        found_after_s: seconds from the session's start until it was found.
        kind: what kind of failure it is (:data:`KINDS`: lost or corrupted data, a wrong
            result, a crash, ...).
    """

    id: str
    signature: str
    clauses: list[str]
    attribution: Attribution
    checks: list[str] = field(default_factory=list)
    first_check: str = ""
    late: bool = False
    seen_late: bool = False
    found_after_s: float = 0.0
    example: str = ""
    reproduce: str = ""
    kind: str = ""

    def add_check(self, check_id: str) -> None:
        """Count ``check_id`` as affected (each once)."""
        if check_id not in self.checks:
            self.checks.append(check_id)


class Findings:
    """The session's findings, by signature, in the order they were found."""

    def __init__(self) -> None:
        self.by_signature: dict[str, Finding] = {}
        self.by_place: dict[str, Finding] = {}  # findings of errors a clause was named for
        #: findings of untagged errors (of all the check's clauses), by place
        self.by_untagged_place: dict[str, Finding] = {}
        #: findings of a suite's report of a wrong nested value, by that difference
        self.by_difference: dict[str, Finding] = {}
        #: findings of an exception raised in the strategy's (or torch's) code, by the same
        #: raise (:func:`same_raise`): type, masked message, line and torch's frame
        self.by_raise: dict[str, Finding] = {}

    def resolve(self, attribution: Attribution) -> Attribution:
        """An untagged error raised where a tagged finding's error was is that finding's
        (a check calling the strategy without ``harness.clause`` met a known bug)."""
        known = self.by_place.get(attribution.place) if not attribution.clause else None
        if known is None or not known.attribution.clause:
            return attribution
        return replace(attribution, clause=known.attribution.clause)

    def settle(self, attribution: Attribution, check_clauses: list[str]) -> Attribution:
        """The attribution a failure of a check declaring ``check_clauses`` is filed by:
        :meth:`resolve`, then an untagged error nobody found yet gets the clause of the
        strategy method it was raised in (:func:`~harness.verdicts.attribution.method_clause`),
        and a training step after a load nobody found broken the round trip's the check
        declares (the step ran on what the load left)."""
        attribution = self.resolve(attribution)
        unknown = (
            self.explaining(attribution) is None and self.match(attribution, check_clauses) is None
        )
        if not attribution.clause and unknown:
            attribution = replace(
                attribution, clause=method_clause(attribution.method, check_clauses)
            )
        if attribution.method in TRAINING_METHODS and attribution.through and unknown:
            loaded = next((c for c in attribution.through if c in check_clauses), "")
            attribution = replace(attribution, clause=loaded or attribution.clause)
        return attribution

    def __len__(self) -> int:
        return len(self.by_signature)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.by_signature.values())

    def known(self, signature: str) -> Finding | None:
        """The finding with this signature, if one was found already."""
        return self.by_signature.get(signature)

    def match(self, attribution: Attribution, clauses: list[str]) -> Finding | None:
        """The finding this failure belongs to, if it was found already: the same signature,
        or, for an error no clause was named for, the same error raised at the same place in
        a check of other clauses (one root cause met by checks of different clauses)."""
        known = self.by_signature.get(attribution.signature(clauses))
        if known is None and not attribution.clause and attribution.place:
            known = self.by_untagged_place.get(attribution.place)
        if known is None and attribution.same_difference:
            known = self.by_difference.get(attribution.same_difference)
        return known

    def same_cause(self, attribution: Attribution, clauses: list[str]) -> Finding | None:
        """The finding of the same raise under another signature ([Note: one cause, one
        finding]): the same exception raised at the same line of the strategy (or of torch,
        reached from the same strategy line) in a check of other clauses, or tagged with
        another clause on the way; None when :meth:`match` already finds the failure's own."""
        key = same_raise(attribution)
        if not key or self.match(attribution, clauses) is not None:
            return None
        return self.by_raise.get(key)

    def explaining(self, attribution: Attribution) -> Finding | None:
        """The finding that explains a failure met looking through other clauses' methods: the
        first (not only late) finding under one of ``attribution.through``, or None."""
        wanted = set(attribution.through)
        return next(
            (f for f in self if not f.late and wanted & set(f.clauses)),
            None,
        )

    def record(
        self,
        attribution: Attribution,
        clauses: list[str],
        check_id: str,
        *,
        late: bool = False,
        elapsed_s: float = 0.0,
    ) -> Finding:
        """The finding for this failure (a new one if its signature is new); counts the check.

        Args:
            attribution: the failure.
            clauses: the clauses the failure is attributed to.
            check_id: the check it happened in.
            late: it was recorded after the check's property was tested.
            elapsed_s: seconds since the session started (for "time to first failure").
        """
        signature = attribution.signature(clauses)
        finding = self.match(attribution, clauses)
        if finding is None:
            finding = Finding(
                id=f"F{len(self.by_signature) + 1}",
                signature=signature,
                clauses=list(clauses),
                attribution=attribution,
                first_check=check_id,
                late=late,
                found_after_s=round(elapsed_s, 1),
                kind=failure_kind(attribution, list(clauses)),
            )
            self.by_signature[signature] = finding
            if attribution.clause and attribution.place:
                self.by_place.setdefault(attribution.place, finding)
            elif attribution.place:
                self.by_untagged_place.setdefault(attribution.place, finding)
            if attribution.same_difference:
                self.by_difference.setdefault(attribution.same_difference, finding)
            if same_raise(attribution):
                self.by_raise.setdefault(same_raise(attribution), finding)
        finding.clauses.extend(c for c in clauses if c not in finding.clauses)
        finding.seen_late = finding.seen_late or late
        finding.add_check(check_id)
        return finding
