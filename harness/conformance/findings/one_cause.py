"""One cause, one finding: the same raise met by checks of other clauses joins one finding.

[Note: one cause, one finding] A strategy bug that raises is met by every check that reaches
the line: a round trip trains before it saves, a precision check trains under two mixed
precisions, a configuration-cover check declares a dozen clauses. Each check may file the
failure under another clause (its own ``clause(...)`` block, the method's clause, the round
trip's after a load), which made one finding per clause. The rule:

- Two failures are *the same raise* when both were raised in the strategy's (or torch's)
  code, with the same exception type, the same masked message (numbers, shapes, paths,
  precisions and dtypes masked: :func:`harness.conformance.findings.signatures.mask`) and the same
  location: the strategy's line (``where``, with its line number) and, for an exception
  torch raised, torch's own frame (``raised_in``). A suite's assertion, a crash and a hang
  are never the same raise (they name no line).
- A failure that is the same raise as a finding already made, under another signature,
  joins that finding (:meth:`harness.conformance.findings.grouping.Findings.same_cause`): the
  finding keeps its clause, which is the clause of the first failure; the check fails under it when
  it declares it, else it is ``blocked`` by it (:func:`joined_clauses`). No clause is added:
  one bug reads under one clause.

A wrong value rather than a raise groups by what is wrong in it (the *difference*: a
checkpoint as written, a nested value after a load), not by this rule.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.conformance.findings.signatures import Attribution

__all__ = ["joined_clauses", "same_raise"]


def same_raise(attribution: Attribution) -> str:
    """The key two failures of the same raise share: type, masked message, the strategy's
    line and torch's frame; ``""`` for a failure that is not a raise at a known line."""
    if attribution.kind != "raised" or not attribution.where:
        return ""
    torch_frame = f" (raised in {attribution.raised_in})" if attribution.raised_in else ""
    return f"{attribution.type_name}: {attribution.key} @ {attribution.where}{torch_frame}"


def joined_clauses(
    finding_clauses: Sequence[str], check_clauses: Sequence[str]
) -> tuple[list[str], str]:
    """The clauses a check that met a known raise fails under, and the clause that blocked it
    (or ``""``): the finding's clauses the check declares, else the finding's first clause,
    which then blocks the check."""
    own = [c for c in finding_clauses if c in check_clauses]
    if own:
        return own, ""
    first = finding_clauses[0] if finding_clauses else ""
    return [first], first
