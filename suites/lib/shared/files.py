"""Digests of files on disk: whether a save or a failed load left a checkpoint as it was.

Used on the ranks (an error case digests the checkpoint before and after, see
:func:`suites.lib.ranks.checkpoint_jobs.attempt`) and in the controller (a failed save must
keep the old checkpoint byte for byte).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["files_digest"]


def files_digest(root: str | os.PathLike[str]) -> dict[str, str]:
    """Every file under ``root`` (or ``root`` itself) with the sha256 of its content."""
    base = Path(root)
    paths = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
    return {
        str(p.relative_to(base.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths
    }
