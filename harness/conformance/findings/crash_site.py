"""What a crashed rank was doing, read from its fatal-error dump.

A rank that dies of a signal (SIGSEGV, SIGABRT) raises nothing, so no ``harness.clause``
block can tag its failure, and the crash would be filed under every clause of its check. Its
faulthandler dump still lists the frames it died in. The innermost frame in shardcheck's own
code (``suites/``, ``harness/``) that sits inside a ``with clause("X"):`` block of its
source says which clause's method was running: the clause the same code would have tagged
an exception with. A rank that died inside the strategy's ``load_checkpoint`` or
``save_checkpoint`` was looking through the round trip (:func:`crashed_inside`).
"""

from __future__ import annotations

import linecache
import re
from pathlib import Path

__all__ = ["CRASH_THROUGH", "OWN_DIRS", "clause_at_crash", "crashed_inside", "dump_frames"]

_ROOT = Path(__file__).resolve().parents[3]
#: frames in these directories are shardcheck's own (not where a strategy's bug lives)
OWN_DIRS = tuple(str(_ROOT / d) + "/" for d in ("harness", "suites"))
#: the clauses whose finding explains a rank that crashed inside a checkpoint method
CRASH_THROUGH = ("CKPT-RT-1", "CKPT-RT-2")
#: a frame of a faulthandler dump: ``  File "/x/y.py", line 73 in load_checkpoint``
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)', re.M)
#: the start of one thread's frames in a dump
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+", re.M)
#: ``with clause("CLIP-1"):`` or ``with clause("API-2"), other():`` (not ``after=True``)
_CLAUSE_BLOCK = re.compile(r'^with\s+clause\(\s*["\'](?P<id>[A-Z]+(?:-[A-Z]+)*-\d+)["\']\s*\)')


def dump_frames(dump: str) -> list[tuple[str, int, str]]:
    """The frames of the thread that died (the dump's ``Current thread``, else its first
    thread), most recent call first, as ``(file, line, function)``."""
    blocks = [m.start() for m in _THREAD.finditer(dump)] or [0]
    current = next((s for s in blocks if dump.startswith("Current thread", s)), blocks[0])
    following = [s for s in blocks if s > current]
    text = dump[current : following[0] if following else len(dump)]
    return [(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(text)]


def clause_at_crash(dump: str) -> str:
    """The clause of the innermost ``with clause(...)`` block of shardcheck's own code that
    the dead thread was inside, or ``""`` (no dump, or no such block on its stack)."""
    for file, line, _ in dump_frames(dump):
        if file.startswith(OWN_DIRS):
            found = _enclosing_clause(file, line)
            if found:
                return found
    return ""


def crashed_inside(dump: str) -> tuple[str, ...]:
    """The clauses a crashed rank's dump says it died under: inside the strategy's
    ``load_checkpoint`` or ``save_checkpoint`` (any thread's frame) it died in a round trip,
    and a known round-trip finding explains it ([Note: looking through]); else ``()``."""
    methods = {m["func"] for m in _FRAME.finditer(dump)}
    return CRASH_THROUGH if methods & {"load_checkpoint", "save_checkpoint"} else ()


def _enclosing_clause(file: str, line: int) -> str:
    """The clause of the ``with clause(...)`` block around ``file:line`` in the function that
    holds it, or ``""``: walks up the source to ever less indented lines, stopping at the
    function's ``def``."""
    text = linecache.getline(file, line)
    if not text.strip():
        return ""
    indent = _indent(text)
    for number in range(line - 1, 0, -1):
        above = linecache.getline(file, number)
        stripped = above.strip()
        if not stripped or stripped.startswith("#") or _indent(above) >= indent:
            continue
        indent = _indent(above)
        match = _CLAUSE_BLOCK.match(stripped)
        if match:
            return match["id"]
        if stripped.startswith(("def ", "async def ")):
            return ""
    return ""


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())
