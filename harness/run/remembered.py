"""Refusals remembered for the session: an option value the strategy refused is not sent again.

An ``Unsupported`` that names an option and value (``Unsupported(reason, option, value)``) is
remembered per family; the examples of later checks with that value are refused from memory,
without dispatching a job (not those of the check that learned it: Hypothesis replays
examples and needs each to behave the same every time). The session keeps one
(:attr:`harness.run.session.HarnessSession.remembered`); the suites' dispatch consults it.

A job that builds no drawn configuration but a fixed set of families (each it can: it is
refused only when the strategy offers none of them) declares them; its refusal of one of
them is marked with :func:`mark_built_families`, so that the refusal economy knows every
example of the check meets it alike (:func:`built_families`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.contract import Unsupported, short_value

__all__ = ["RememberedRefusals", "built_families", "is_remembered", "mark_built_families"]


def _flat_options(family: str, options: Mapping[str, Any]) -> dict[str, str]:
    flat = {k: short_value(v) for k, v in options.items() if k != "extra"}
    extra = options.get("extra")
    if isinstance(extra, Mapping):
        flat.update({k: short_value(v) for k, v in extra.items()})
    flat["family"] = family
    return flat


class RememberedRefusals:
    """``Unsupported`` answers naming an option value, remembered per family."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str, str], Unsupported] = {}
        #: what checks before this one learned: a check consults only these, so that its
        #: examples behave the same however often Hypothesis replays them
        self.frozen: dict[tuple[str, str, str], Unsupported] = {}
        self.skipped_jobs = 0

    def clear(self) -> None:
        """Forget everything (a new session)."""
        self.by_key.clear()
        self.frozen.clear()
        self.skipped_jobs = 0

    def begin_check(self) -> None:
        """A check starts: it may use what the checks before it learned."""
        self.frozen = dict(self.by_key)

    def remember(self, family: str, options: Mapping[str, Any], exc: Unsupported) -> None:
        """Remember ``exc`` if it names an option value this example used."""
        if exc.option is None:
            return
        value = short_value(exc.value)
        if _flat_options(family, options).get(exc.option) == value:
            self.by_key[(family, exc.option, value)] = exc

    def refused(self, family: str, options: Mapping[str, Any]) -> Unsupported | None:
        """The remembered refusal this example's options meet, if any (a fresh copy marked
        ``remembered``, see :func:`is_remembered`)."""
        if not self.frozen:
            return None
        for option, value in _flat_options(family, options).items():
            exc = self.frozen.get((family, option, value))
            if exc is not None:
                self.skipped_jobs += 1
                again = Unsupported(exc.reason, exc.option, exc.value)
                again.remembered = True  # type: ignore[attr-defined]
                return again
        return None

    def refused_every(self, families: tuple[str, ...]) -> Unsupported | None:
        """The remembered refusal of the last of ``families`` when each is remembered refused
        (a job that builds each family the strategy offers is refused only then), else None."""
        if not families or any(self._family_refusal(f) is None for f in families):
            return None
        return self.refused(families[-1], {})

    def _family_refusal(self, family: str) -> Unsupported | None:
        return self.frozen.get((family, "family", family))


def is_remembered(exc: Unsupported) -> bool:
    """Whether ``exc`` is a remembered refusal (no rank job was dispatched for it)."""
    return bool(getattr(exc, "remembered", False))


def mark_built_families(exc: Unsupported, families: tuple[str, ...]) -> Unsupported:
    """Mark ``exc`` as met by a job that builds ``families`` whatever its example drew
    (returns ``exc``)."""
    exc.built_families = tuple(families)  # type: ignore[attr-defined]
    return exc


def built_families(exc: Unsupported) -> tuple[str, ...]:
    """The families the job that met ``exc`` builds in every example (see
    :func:`mark_built_families`); ``()`` when it declared none."""
    return tuple(getattr(exc, "built_families", ()))
