"""The clause ids of SPEC.md, by section: what the suites must cover.

SPEC.md lives outside the package, so the ids are kept here, in the order SPEC.md lists
them; ``tests/test_clause_coverage.py`` checks that every one of them is named by some
``@pytest.mark.clause(...)`` in ``suites/``. A clause that changes meaning gets a new id in
SPEC.md, and the new id goes here too (ids are never reused).
"""

from __future__ import annotations

__all__ = ["ALL_CLAUSES", "SECTIONS", "clauses_of"]

#: section number -> (title, clause ids in SPEC.md order)
SECTIONS: dict[int, tuple[str, tuple[str, ...]]] = {
    1: (
        "The strategy object (API surface)",
        ("API-1", "API-2", "API-3", "API-4", "API-5", "API-6", "API-7", "API-8"),
    ),
    2: (
        "Construction and validation",
        (
            "CFG-1",
            "CFG-2",
            "CFG-3",
            "CFG-4",
            "CFG-5",
            "CFG-6",
            "CFG-7",
            "CFG-8",
            "CFG-9",
            "CFG-10",
        ),
    ),
    3: (
        "Sharding, wrapping and activation checkpointing",
        ("SHARD-1", "SHARD-2", "WRAP-1", "WRAP-2", "AC-1", "AC-2"),
    ),
    4: (
        "Training semantics",
        (
            "TRAIN-1",
            "TRAIN-2",
            "TRAIN-3",
            "SYNC-1",
            "CLIP-1",
            "PREC-1",
            "PREC-2",
            "PREC-3",
            "PREC-4",
            "INIT-1",
        ),
    ),
    5: (
        "Checkpoints",
        (
            "CKPT-SAVE-1",
            "CKPT-SAVE-2",
            "CKPT-SAVE-3",
            "CKPT-SAVE-4",
            "CKPT-SAVE-5",
            "CKPT-LOAD-1",
            "CKPT-LOAD-2",
            "CKPT-RT-1",
            "CKPT-RT-2",
            "CKPT-RT-3",
            "CKPT-RT-4",
            "CKPT-RT-5",
            "CKPT-REKEY-1",
            "CKPT-REKEY-2",
            "CKPT-TRAINER-1",
            "CKPT-STRICT-1",
            "CKPT-STRICT-2",
            "CKPT-STRICT-3",
            "CKPT-BUF-1",
            "CKPT-RT-6",
            "CKPT-SEC-1",
        ),
    ),
    6: ("Model-parallel specifics", ("MP-1", "MP-2", "MP-3", "MP-4")),
}

#: every clause id, in SPEC.md order
ALL_CLAUSES: tuple[str, ...] = tuple(i for _, ids in SECTIONS.values() for i in ids)


def clauses_of(*sections: int) -> tuple[str, ...]:
    """The clause ids of the given SPEC.md sections, in order.

    Args:
        *sections: section numbers (1-6).

    Raises:
        ValueError: a section SPEC.md does not have.
    """
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(
            f"clauses_of{sections!r}: SPEC.md has no section {unknown}; use "
            f"{', '.join(map(str, SECTIONS))}."
        )
    return tuple(i for s in sections for i in SECTIONS[s][1])
