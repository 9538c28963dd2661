"""shardcheck's contract: what a conforming sharded strategy does, clause by clause.

One registry that the suites (``@pytest.mark.clause`` ids), the conformance report (each
failing clause's text), the clause-coverage test, ``pytest --list-clauses`` and
``CONTRACT.md`` (``python -m harness.clauses --write CONTRACT.md``) all read::

    from harness.clauses import CLAUSES, SECTIONS, clause_text
    clause_text("CKPT-RT-3")   # -> "Resharding: in either format, ..."

The arguments of the contract's methods that take more than one legal value are axes too
(:mod:`harness.clauses.arguments`), and so are words of the contract only some models meet
(:mod:`harness.clauses.words`: "each instance of those classes"): a clause's ``scope`` names
those it speaks of.
"""

from __future__ import annotations

from harness.clauses.api_and_training import API, CONSTRUCTION, SHARDING, TRAINING
from harness.clauses.arguments import ARGUMENT_AXES, ARGUMENTS, Argument
from harness.clauses.checkpoints import CHECKPOINTS, MODEL_PARALLEL
from harness.clauses.cost import COST
from harness.clauses.fsdp2 import FSDP2
from harness.clauses.registry import (
    FAMILIES,
    Clause,
    Section,
    UnknownClauseError,
    build_index,
    match_ids,
)
from harness.clauses.words import WORD_AXES, WORDS, ClassWords, Word

__all__ = [
    "ALL_CLAUSES",
    "ARGUMENTS",
    "ARGUMENT_AXES",
    "CLAUSES",
    "FAMILIES",
    "PREAMBLE",
    "SECTIONS",
    "WORDS",
    "WORD_AXES",
    "Argument",
    "ClassWords",
    "Clause",
    "Section",
    "UnknownClauseError",
    "Word",
    "clause_text",
    "clauses_of",
    "select",
]

#: What the whole contract assumes; shown above the sections.
PREAMBLE = (
    "A conforming strategy is one object per rank, made by a factory from a `StrategySpec`, "
    "that offers the surface Lightning Fabric's strategies made common. Three families are "
    "covered: **fsdp**, built on `torch.distributed.fsdp.FullyShardedDataParallel` (FSDP1); "
    "**model_parallel**, which gives the model and a 2-D device mesh (`data_parallel` x "
    "`tensor_parallel`) to a user `parallelize_fn` applying FSDP2 `fully_shard` and/or tensor "
    "parallelism; and **fsdp2**, which applies `fully_shard` itself by its own wrap policy "
    "(section 7). Each clause says which families it applies to (the families column); a "
    "clause that applies to none of the families a strategy offers reads `not applicable` in "
    "that strategy's report. Every clause names the exception a conforming strategy raises, "
    "and the "
    "message names the offending value or key. *Equal* means bitwise for state that only moved "
    "between processes or files, and within the suites' tolerance table (precision x optimizer) "
    "for anything computed again. A configuration the strategy does not support is answered "
    "with `harness.Unsupported` and reported as such, never counted as a failure: from the "
    "factory, or from the method that cannot honour a call (`load_checkpoint(..., "
    "strict=False)`), raised on every rank alike and before any collective of that call. "
    "Every method is called on every rank, and one that communicates returns on no rank "
    "before every rank has done its part."
)

#: The sections in order.
SECTIONS: tuple[Section, ...] = (
    API,
    CONSTRUCTION,
    SHARDING,
    TRAINING,
    CHECKPOINTS,
    MODEL_PARALLEL,
    FSDP2,
    COST,
)

#: ``{id: Clause}`` in contract order.
CLAUSES: dict[str, Clause] = build_index(SECTIONS)

#: Every clause id, in contract order.
ALL_CLAUSES: tuple[str, ...] = tuple(CLAUSES)


def clause_text(clause_id: str) -> str:
    """The text of one clause.

    Raises:
        UnknownClauseError: the contract has no such id.
    """
    try:
        return CLAUSES[clause_id].text
    except KeyError:
        raise UnknownClauseError(
            f"the contract has no clause {clause_id!r}; `pytest --list-clauses` lists them all."
        ) from None


def clauses_of(*numbers: int) -> tuple[str, ...]:
    """The clause ids of the given sections (1-8), in order.

    Raises:
        ValueError: a section number the contract does not have.
    """
    known = {s.number: s for s in SECTIONS}
    unknown = [n for n in numbers if n not in known]
    if unknown:
        raise ValueError(
            f"clauses_of{numbers!r}: the contract has no section {unknown}; use "
            f"{', '.join(map(str, known))}."
        )
    return tuple(i for n in numbers for i in known[n].ids)


def select(patterns: str) -> list[str]:
    """The clause ids a ``--clauses`` value selects (comma-separated ids or globs).

    Raises:
        UnknownClauseError: a pattern matches no clause.
    """
    return match_ids([p for p in patterns.split(",") if p.strip()], ALL_CLAUSES)
