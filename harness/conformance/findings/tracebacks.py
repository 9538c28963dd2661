"""Where a failure was raised: the frames of a formatted traceback, and whose code each is.

A frame is shardcheck's own (``harness/``, ``suites/``, and the pytest, pluggy, Hypothesis
and ``contextlib`` frames around them), an installed library's (``site-packages``, Python's
own library) or the strategy's. A failure's place is the innermost frame outside shardcheck
(:func:`where_in_text`); for an exception raised in torch's code, the strategy's line that
called into torch (:func:`caller_of_torch`); for a desync, the first collective a rank
entered outside shardcheck (:func:`collective_site`).
"""

from __future__ import annotations

import re
import sysconfig
import traceback
from pathlib import Path
from types import TracebackType

from harness.conformance.findings.crash_site import OWN_DIRS

__all__ = [
    "FRAME",
    "caller_of_torch",
    "collective_site",
    "is_installed",
    "is_own",
    "short_path",
    "strategy_frame",
    "tb_text",
    "where_in_text",
]

_ROOT = Path(__file__).resolve().parents[3]
#: frames in these directories are shardcheck's own (not where a strategy's bug lives)
_LIBRARY_PARTS = ("/_pytest/", "/pluggy/", "/hypothesis/", "/contextlib.py")
#: a frame of a formatted traceback: ``  File "/x/y.py", line 73, in load_checkpoint``
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)', re.M)
_STDLIB = sysconfig.get_paths()["stdlib"]
#: a desync verdict's line for one rank's collective (harness.verdicts.failures)
_ENTERED = re.compile(r"entered \w+\b.*? at (?P<file>/\S+):(?P<line>\d+) in (?P<func>\S+)")
#: torch's own code (the package and its companions), wherever it is installed
_TORCH = re.compile(r"[/\\](?:torch|functorch|torchgen)[/\\]")


def is_own(path: str) -> bool:
    """Whether a frame's file is shardcheck's own (or the test machinery's around it)."""
    return path.startswith(OWN_DIRS) or any(part in path for part in _LIBRARY_PARTS)


def is_installed(path: str) -> bool:
    """Whether a frame's file is an installed library's or Python's own."""
    return "site-packages" in path or "dist-packages" in path or path.startswith(_STDLIB)


def short_path(path: str) -> str:
    """``path`` relative to shardcheck's checkout, or from ``site-packages/`` on."""
    try:
        return str(Path(path).resolve().relative_to(_ROOT))
    except ValueError:
        marker = "site-packages/"
        return path.split(marker, 1)[1] if marker in path else path


def tb_text(tb: TracebackType | None) -> str:
    """A traceback, formatted (``""`` for none)."""
    return "".join(traceback.format_tb(tb)) if tb is not None else ""


def where_in_text(text: str) -> tuple[str, bool]:
    """The innermost frame outside shardcheck in a formatted traceback; else the innermost."""
    frames = [(m["file"], m["line"], m["func"]) for m in FRAME.finditer(text)]
    if not frames:
        return "", False
    outside = [f for f in frames if not is_own(f[0])]
    file, line, func = (outside or frames)[-1]
    return f"{short_path(file)}:{line} {func}", bool(outside)


def _in_torch(path: str) -> bool:
    return bool(_TORCH.search(path)) and is_installed(path)


def caller_of_torch(text: str) -> tuple[str, str]:
    """For a traceback whose innermost frame outside shardcheck is torch's: ``(the innermost
    frame outside shardcheck, torch and Python's own library, as a location; torch's
    frame)``, the strategy's line that called into torch and where torch raised; ``("",
    "")`` when the exception was not raised in torch or no such caller is on the stack (a
    suite that called torch itself)."""
    frames = [(m["file"], m["line"], m["func"]) for m in FRAME.finditer(text)]
    outside = [f for f in frames if not is_own(f[0])]
    if not outside or not _in_torch(outside[-1][0]):
        return "", ""
    callers = [f for f in outside if not _in_torch(f[0]) and not f[0].startswith(_STDLIB)]
    if not callers:
        return "", ""
    file, line, func = callers[-1]
    torch_file, torch_line, torch_func = outside[-1]
    return (
        f"{short_path(file)}:{line} {func}",
        f"{short_path(torch_file)}:{torch_line} {torch_func}",
    )


def collective_site(story: str) -> tuple[str, bool] | None:
    """The first collective of a desync story entered outside shardcheck (``rank 0 entered
    BARRIER at FILE:LINE in FUNC``), as a location: where the ranks went apart."""
    for match in _ENTERED.finditer(story):
        if not is_own(match["file"]):
            return f"{short_path(match['file'])}:{match['line']} {match['func']}", True
    return None


def strategy_frame(text: str) -> str:
    """The innermost frame of the strategy's own code in a formatted traceback: neither
    shardcheck's nor an installed library's nor Python's; ``""`` when there is none."""
    frames = [(m["file"], m["line"], m["func"]) for m in FRAME.finditer(text)]
    mine = [f for f in frames if not is_own(f[0]) and not is_installed(f[0])]
    if not mine:
        return ""
    file, line, func = mine[-1]
    return f"{short_path(file)}:{line} {func}"
