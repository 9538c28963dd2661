"""The contract registry (:mod:`harness.clauses`): lookups, selection, and CONTRACT.md in sync."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.clauses import (
    ALL_CLAUSES,
    ARGUMENT_AXES,
    ARGUMENTS,
    CLAUSES,
    SECTIONS,
    WORD_AXES,
    WORDS,
    UnknownClauseError,
    clause_text,
    clauses_of,
    select,
)
from harness.clauses.markdown import render_listing, render_markdown
from harness.clauses.registry import Clause, Section, build_index

ROOT = Path(__file__).resolve().parents[1]


def test_every_clause_has_a_text_and_a_unique_id() -> None:
    assert len(ALL_CLAUSES) == len(set(ALL_CLAUSES)) == len(CLAUSES)
    assert [s.number for s in SECTIONS] == [1, 2, 3, 4, 5, 6, 7, 8]
    for clause in CLAUSES.values():
        assert clause.text.strip() and clause.text == clause.text.strip(), clause.id
    assert "A" in clause_text("CKPT-RT-3") and "world size B" in clause_text("CKPT-RT-3")


def test_a_duplicate_id_is_refused() -> None:
    twice = Section(9, "x", (Clause("X-1", "a"), Clause("X-1", "b")))
    with pytest.raises(ValueError, match=r"'X-1' appears twice .* new id"):
        build_index([twice])


def test_unknown_ids_and_sections_are_refused_with_the_fix() -> None:
    with pytest.raises(UnknownClauseError, match=r"no clause 'NOPE-9'.*--list-clauses"):
        clause_text("NOPE-9")
    with pytest.raises(UnknownClauseError, match=r"no clause matches 'NOPE-\*'"):
        select("CLIP-1,NOPE-*")
    with pytest.raises(ValueError, match=r"no section \[9\]"):
        clauses_of(9)


def test_select_takes_ids_and_globs_in_contract_order() -> None:
    assert select("clip-1, API-2") == ["API-2", "CLIP-1"]
    assert select("CKPT-RT-*") == [f"CKPT-RT-{n}" for n in range(1, 7)]
    assert clauses_of(6) == ("MP-1", "MP-2", "MP-3", "MP-4")


def test_contract_md_is_the_rendering_of_the_registry() -> None:
    written = (ROOT / "CONTRACT.md").read_text()
    assert written == render_markdown(), (
        "CONTRACT.md is out of date: run `python -m harness.clauses --write CONTRACT.md`"
    )
    for clause_id in ALL_CLAUSES:
        assert f"| {clause_id} | " in written


def test_listing_wraps_each_text_under_its_id() -> None:
    text = render_listing(["API-8"], width=60)
    lines = text.splitlines()
    assert lines[:3] == ["1. The strategy object (API surface)", "", "API-8"]
    assert all(len(line) <= 60 for line in lines)
    assert "teardown()" in text and "API-7" not in text


def test_the_command_line_prints_and_refuses() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "harness.clauses", "SYNC-1"], capture_output=True, text=True
    )
    assert ok.returncode == 0 and ok.stdout.startswith("4. Training semantics")
    bad = subprocess.run(
        [sys.executable, "-m", "harness.clauses", "SYNC-9"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "no clause matches 'SYNC-9'" in bad.stderr


def test_every_argument_axis_is_a_parameter_of_its_contract_method() -> None:
    import inspect

    from harness.contract import Strategy

    for argument in ARGUMENTS:
        method = getattr(Strategy, argument.method)
        assert argument.name in inspect.signature(method).parameters, argument
        assert len(argument.values) == len(set(argument.values)) >= 2, argument


def test_clause_scopes_name_declared_argument_values_and_own_every_one() -> None:
    declared = {a.name: set(a.values) for a in ARGUMENTS}
    owned: dict[str, set[str]] = {name: set() for name in declared}
    for clause in CLAUSES.values():
        for axis, allowed in clause.scope:
            if axis in ARGUMENT_AXES:
                assert set(allowed) <= declared[axis], (clause.id, axis, allowed)
                owned[axis] |= set(allowed)
    assert owned == declared  # each legal value is some clause's business
    assert dict(CLAUSES["CLIP-1"].scope)["norm_type"] == ("2", "1", "inf", "1.5")


def test_clause_scopes_name_the_contracts_words_and_own_every_one() -> None:
    declared = {w.name: set(w.values) for w in WORDS}
    owned: dict[str, set[str]] = {name: set() for name in declared}
    for clause in CLAUSES.values():
        for axis, allowed in clause.scope:
            if axis in WORD_AXES:
                assert set(allowed) <= declared[axis], (clause.id, axis, allowed)
                owned[axis] |= set(allowed)
    assert owned == declared  # each word is some clause's business
    assert not WORD_AXES & ARGUMENT_AXES
    speaks = {c.id for c in CLAUSES.values() if dict(c.scope).keys() & WORD_AXES}
    assert speaks == {"WRAP-1", "FSDP2-1", "AC-1"}  # "each instance of those classes"
