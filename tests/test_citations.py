"""Every document the code and docs cite is one the repository holds.

A reader of a docstring, comment or page can only follow a citation to a file they have. This
scans the project's code and doc files (``.py``, ``.md``, ``.sh``, ``.toml``, ``.yml``; not
virtual environments, ``reports/`` or ``.hypothesis/``) for two kinds of citation:

- a Markdown file name (``CONTRACT.md``, ``docs/findings.md``), anywhere in the text;
- a relative Markdown link (``[text](../harness/run/jobs.py)``) in a ``.md`` file, outside code.

Each must resolve, relative to the citing file or to the repository root, to a file inside
the repository. Names the code *writes* rather than cites are listed in :data:`GENERATED`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Container, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: not scanned: its self-test below writes deliberately bad citations
THIS_FILE = Path(__file__).resolve()
SUFFIXES = (".py", ".md", ".sh", ".toml", ".yml", ".yaml")
#: directories never scanned, at any depth (caches, builds, version control)
SKIP_DIRS = {".git", ".hypothesis", "__pycache__", "build", "dist", "node_modules"}
#: directories never scanned at the repository root (run outputs)
SKIP_TOP = {"reports"}
#: Markdown names that are outputs of the harness, not documents: name -> who writes it
GENERATED = {
    "report.md": "harness/report/write.py (the conformance report)",
    "summary.md": "harness/report/write.py (the conformance report's summary)",
}

_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.I)
_MD_NAME = re.compile(r"(?<![\w*./-])((?:\.{1,2}/)*[\w-][\w.-]*(?:/[\w.-]+)*\.md)(?![\w-])")
_LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_FENCES = ("```", "~~~")


def _skipped(directory: str, relative: Path) -> bool:
    top = len(relative.parts) == 0
    return (
        directory in SKIP_DIRS
        or directory.startswith(".venv")
        or directory.endswith(("_cache", ".egg-info"))
        or (top and directory in SKIP_TOP)
    )


def scanned_files(root: Path) -> Iterator[Path]:
    """The code and doc files under ``root`` that are scanned, in a stable order."""
    for current, dirs, files in os.walk(root):
        relative = Path(current).relative_to(root)
        dirs[:] = sorted(d for d in dirs if not _skipped(d, relative))
        for name in sorted(files):
            if name.endswith(SUFFIXES):
                yield Path(current) / name


def citations(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, name)`` for each Markdown file name and each relative Markdown link target
    (anchor dropped) in ``path``."""
    in_fence = False
    is_markdown = path.suffix == ".md"
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        fence = is_markdown and line.lstrip().startswith(_FENCES)
        if fence:
            in_fence = not in_fence
        if ".md" in line:  # most lines cite nothing: skip the regular expressions
            for match in _MD_NAME.finditer(_URL.sub(" ", line)):
                yield number, match.group(1)
        if not is_markdown or fence or in_fence or "](" not in line:
            continue
        for match in _LINK.finditer(_CODE_SPAN.sub(" ", line)):
            target = match.group(1).split("#", 1)[0]
            if target and not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
                yield number, target


def resolves(root: Path, citing: Path, name: str) -> bool:
    """Whether ``name`` exists inside ``root`` (a file, or a folder a link may point at),
    relative to ``citing``'s directory or to ``root``."""
    inside = root.resolve()
    for base in (citing.parent, root):
        candidate = (base / name).resolve()
        if candidate.is_relative_to(inside) and candidate.exists():
            return True
    return False


def bad_citations(root: Path, exclude: Container[Path] = ()) -> list[str]:
    """``path:line: NAME`` for every citation under ``root`` that does not resolve (files in
    ``exclude`` are not scanned)."""
    bad: dict[str, None] = {}  # ordered, each once (a link to a .md name is both kinds)
    for path in scanned_files(root):
        if path in exclude:
            continue
        for number, name in citations(path):
            if Path(name).name in GENERATED or resolves(root, path, name):
                continue
            bad[f"{path.relative_to(root)}:{number}: {name}"] = None
    return list(bad)


def test_every_cited_document_is_in_the_repository() -> None:
    bad = bad_citations(ROOT, exclude={THIS_FILE})
    assert not bad, (
        f"{len(bad)} citation(s) of a document the repository does not contain:\n"
        + "\n".join(f"  {line}" for line in bad)
        + "\nCite a file the repository holds (CONTRACT.md for clauses, README.md, a page of "
        "docs/), or state the fact in the sentence itself; notes kept outside the repository "
        "are not available to its users. A relative link resolves from the citing file's "
        "directory or from the repository root. A Markdown name the code writes rather than "
        "cites belongs in GENERATED in tests/test_citations.py."
    )


def test_the_scan_finds_what_it_should(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "reports").mkdir()
    (tmp_path / ".venv").mkdir()
    (tmp_path / "CONTRACT.md").write_text("# contract\n")
    (tmp_path / "docs" / "page.md").write_text(
        "See [the contract](../CONTRACT.md#api), [a page](page.md) and [gone](missing.py).\n"
        "Also [web](https://example.org/X.md) and `[code](nowhere.md)` in a span.\n"
        "```\n[fenced](fenced.py)\n```\n"
    )
    (tmp_path / "mod.py").write_text(
        '"""Per PLAN.md section 1 and ../shared/NOTES.md; CONTRACT.md and docs/page.md."""\n'
        "# writes report.md; ignores *.md; see https://example.org/README.md\n"
    )
    (tmp_path / "reports" / "old.md").write_text("PLAN.md\n")
    (tmp_path / ".venv" / "lib.py").write_text("# PLAN.md\n")
    assert bad_citations(tmp_path) == [
        "mod.py:1: PLAN.md",
        "mod.py:1: ../shared/NOTES.md",
        "docs/page.md:1: missing.py",
        "docs/page.md:2: nowhere.md",
    ]
