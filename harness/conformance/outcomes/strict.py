"""``--conformance-strict``: the verdict on the run, and the same verdict in the JUnit file.

pytest counts a check that failed as the expected-failures file lists as ``xfailed`` and
one the strategy declared unsupported as ``skipped``; neither fails pytest's run. Strict mode
fails it where the run does not conform although no check failed (the strategy offered
nothing to check, or ``--require-whole-space`` is given and it refused some configurations,
or a violation was recorded after a check's property). pytest's last line then counts those
checks as ``nonconforming``, and, when no test case failed, so that a CI system reading only
the ``--junitxml`` file sees the same red run, :func:`add_to_junit` adds one failed test case,
``shardcheck.conformance-strict``, that says why.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from harness.report import Report, nonconforming

__all__ = ["JUNIT_CASE", "StrictVerdict", "add_to_junit", "strict_verdict"]

#: the JUnit test case (``classname.name``) that carries a failed strict verdict
JUNIT_CASE = ("shardcheck", "conformance-strict")


@dataclass(frozen=True)
class StrictVerdict:
    """A strict run's verdict.

    Args:
        passed: whether the run conforms.
        sentence: why, one line (printed after ``conformance-strict: ``).
        nonconforming: the ids of the checks (or late findings) that keep it from conforming.
    """

    passed: bool
    sentence: str
    nonconforming: tuple[str, ...] = ()


def strict_verdict(report: Report, whole_space: bool) -> StrictVerdict:
    """The strict verdict of ``report`` (``whole_space``: ``--require-whole-space``)."""
    bad = nonconforming(report.checks, whole_space)
    expected = set(report.expected_failures.get("late_findings_expected", []))
    late = [f for f in report.findings if f.late and not set(f.clauses) <= expected]
    if not bad and late:
        ids = ", ".join(f"{f.id} ({', '.join(f.clauses)})" for f in late)
        return StrictVerdict(
            False,
            f"every check passed, but findings {ids} were recorded after their checks' properties",
            tuple(f.id for f in late),
        )
    if not bad:
        return StrictVerdict(True, _conforming_sentence(report))
    counts: dict[str, int] = {}
    for check in bad:
        counts[check.outcome] = counts.get(check.outcome, 0) + 1
    listing = ", ".join(f"{n} {o}" for o, n in counts.items())
    if all(c.outcome == "unsupported" for c in bad) and not whole_space:
        sentence = (
            f"the strategy declared every check it met unsupported ({len(bad)}): it offered "
            "nothing to check"
        )
    else:
        allowed = "passed nor environment" if whole_space else "passed, environment nor unsupported"
        sentence = f"{len(bad)} checks are neither {allowed} ({listing})"
    return StrictVerdict(False, sentence, tuple(c.id for c in bad))


def _conforming_sentence(report: Report) -> str:
    counts = report.counts()
    parts = ["every check passed"]
    if counts["xfailed"]:
        parts.append(f"failed as the expected-failures file lists ({counts['xfailed']})")
    parts.append("or needs another environment")
    sentence = ", ".join(parts[:-1]) + " " + parts[-1]
    if counts["unsupported"]:
        sentence += (
            f"; {counts['unsupported']} declared unsupported (the strategy offers part of the "
            "space: --require-whole-space demands all of it)"
        )
    return sentence


def add_to_junit(path: str | Path, verdict: StrictVerdict) -> None:
    """Add the failed test case ``shardcheck.conformance-strict`` to the JUnit file at
    ``path`` (written by pytest's ``--junitxml``), and count it in its totals.

    Raises:
        ValueError: the file is not a JUnit XML file pytest wrote.
    """
    file = Path(path)
    tree = ET.parse(file)
    root = tree.getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError(
            f"{str(file)!r} has no <testsuite> element; pass the file pytest's --junitxml wrote."
        )
    case = ET.SubElement(suite, "testcase", classname=JUNIT_CASE[0], name=JUNIT_CASE[1])
    case.set("time", "0.000")
    failure = ET.SubElement(case, "failure", message=f"conformance-strict: {verdict.sentence}")
    failure.text = "\n".join(["the run does not conform:", *verdict.nonconforming])
    for name in ("tests", "failures"):
        suite.set(name, str(int(suite.get(name, "0")) + 1))
    if root is not suite:
        for name in ("tests", "failures"):
            if root.get(name) is not None:
                root.set(name, str(int(root.get(name, "0")) + 1))
    tree.write(file, encoding="utf-8", xml_declaration=True)
