"""Shortening text at a word boundary: a headline, a signature or a table cell that must
fit is cut between two words, never inside one."""

from __future__ import annotations

__all__ = ["shorten"]


def shorten(text: str, limit: int, mark: str = "...") -> str:
    """``text`` if it fits in ``limit`` characters, else its words that fit followed by
    ``mark`` (the whole result within ``limit``). A first word longer than the room (a path)
    is cut where the room ends: there is no boundary to cut at."""
    if len(text) <= limit:
        return text
    room = max(limit - len(mark), 0)
    head = text[: room + 1]
    cut = head.rfind(" ")
    kept = head[:cut] if cut > 0 else text[:room]
    return kept.rstrip(" ,;:") + mark
