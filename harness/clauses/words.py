"""Words of the contract that only some models meet: axes of what a policy finds in a model.

WRAP-1, FSDP2-1 and AC-1 say that a policy given classes selects "each instance of those
classes". Whether a configuration puts those words to the test depends on its model and its
policy together: a model may hold an instance of a listed class itself, of a subclass of one,
or of another module's class that only shares a listed class's name (which is no instance of
it); and AC-1's "never one checkpoint wrapper inside another" is put to the test only where
the policy selects a module inside another it selects. No axis of the configuration space
says that, so each is an axis of its own here: the
suites' jobs report the values their configuration meets
(:func:`suites.lib.shared.axes.scenario_axes`), and a clause's ``scope`` names those it speaks
of.

Such an axis is counted like an argument (:mod:`harness.clauses.arguments`): it restricts no
other axis of a scope and is left out of the pairs of configuration values, and the values a
clause's checks never reached are those of its scope, so an axis the scope does not name is
none of that clause's business (:mod:`harness.conformance.output.coverage`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WORDS", "WORD_AXES", "ClassWords", "Word"]


class ClassWords:
    """What a policy of classes meets in a model, as the coverage table writes it."""

    #: a module whose class is a listed class
    LISTED = "listed class"
    #: an instance of a subclass of a listed class (selected: it is an instance)
    SUBCLASS = "subclass of a listed class"
    #: a module of another module's class named like a listed class (not selected)
    SAME_NAME = "same-named class from another module"

    ALL = (LISTED, SUBCLASS, SAME_NAME)

    #: a selected module inside another selected one (AC-1: "never one checkpoint wrapper
    #: inside another", so only the outer one is checkpointed)
    NESTED = "selected inside a selected module"


@dataclass(frozen=True)
class Word:
    """One axis of the contract's words.

    Attributes:
        name: the axis's name.
        option: the strategy option whose policy the values describe.
        values: the values the contract's words name, as the coverage table writes them.
    """

    name: str
    option: str
    values: tuple[str, ...]


#: Every axis of the contract's words.
WORDS: tuple[Word, ...] = (
    Word("wrap classes", "auto_wrap_policy", ClassWords.ALL),
    Word(
        "checkpointing classes",
        "activation_checkpointing_policy",
        (*ClassWords.ALL, ClassWords.NESTED),
    ),
)

#: The names of the word axes.
WORD_AXES: frozenset[str] = frozenset(w.name for w in WORDS)
