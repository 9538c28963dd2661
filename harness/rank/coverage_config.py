"""The settings of a rank-coverage run and how they travel to the rank processes.

The controller writes them as JSON into the environment variable :data:`ENV_VAR` before the
forkserver starts; every rank (a forked pool rank, or a ``torchrun`` rank in attach mode)
reads them back in :func:`harness.rank.coverage.start_from_env`. The JSON is an object
``{"data_dir": "/abs/dir", "sources": ["reference_impl"], "branch": true}``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

__all__ = [
    "DEFAULT_SOURCE",
    "ENV_VAR",
    "INSTALL_HINT",
    "RankCoverageConfig",
    "parse_sources",
    "require_coverage",
]

ENV_VAR = "SHARDCHECK_RANK_COVERAGE"
DEFAULT_SOURCE = "reference_impl"
INSTALL_HINT = "pip install 'coverage>=7.4'  (or: pip install -e '.[dev]')"
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class RankCoverageConfig:
    """What to measure and where every process writes its data file.

    Args:
        data_dir: absolute directory of the per-process data files.
        sources: importable package or module names to measure.
        branch: measure branches as well as lines.
    """

    data_dir: str
    sources: tuple[str, ...]
    branch: bool = True

    def to_json(self) -> str:
        """The JSON text stored in :data:`ENV_VAR`."""
        return json.dumps(
            {"data_dir": self.data_dir, "sources": list(self.sources), "branch": self.branch}
        )

    @classmethod
    def from_json(cls, text: str) -> RankCoverageConfig:
        """Read the JSON text of :data:`ENV_VAR`.

        Raises:
            ValueError: the text is not such an object (the message shows the expected form).
        """
        expected = (
            f'expected {ENV_VAR}=\'{{"data_dir": "/abs/dir", "sources": ["reference_impl"], '
            '"branch": true}\''
        )
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_VAR}={text!r} is not JSON ({exc}); {expected}.") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{ENV_VAR}={text!r} is not a JSON object; {expected}.")
        data_dir = raw.get("data_dir")
        sources = raw.get("sources", [DEFAULT_SOURCE])
        branch = raw.get("branch", True)
        if not isinstance(data_dir, str) or not os.path.isabs(data_dir):
            raise ValueError(
                f"{ENV_VAR}: data_dir={data_dir!r} must be an absolute directory path; {expected}."
            )
        if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
            raise ValueError(f"{ENV_VAR}: sources={sources!r} must be a list of names; {expected}.")
        if not isinstance(branch, bool):
            raise ValueError(f"{ENV_VAR}: branch={branch!r} must be true or false; {expected}.")
        return cls(data_dir, parse_sources(",".join(sources)), branch)


def parse_sources(value: str) -> tuple[str, ...]:
    """Split ``PKG[,PKG]`` into checked, de-duplicated dotted names.

    Raises:
        ValueError: empty, or a name that is not a dotted Python identifier.
    """
    names = [part.strip() for part in value.split(",")]
    if not value.strip() or not all(names):
        raise ValueError(
            f"--rank-coverage={value!r}: give one or more package or module names separated "
            f"by commas, for example --rank-coverage={DEFAULT_SOURCE} (or the option alone)."
        )
    for name in names:
        if not _DOTTED.fullmatch(name):
            raise ValueError(
                f"--rank-coverage={value!r}: {name!r} is not an importable dotted name such as "
                f"{DEFAULT_SOURCE} or mypkg.strategies. To measure {DEFAULT_SOURCE} while "
                f"passing test paths, write the option last or as --rank-coverage={DEFAULT_SOURCE}."
            )
    return tuple(dict.fromkeys(names))


def require_coverage() -> None:
    """Check that ``coverage`` (7.4 or newer) is importable.

    Raises:
        ModuleNotFoundError: it is missing (the message names the install command).
        ImportError: it is too old.
    """
    try:
        import coverage
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"--rank-coverage needs the 'coverage' package, which is not installed; "
            f"install it with: {INSTALL_HINT}",
            name="coverage",
        ) from None
    major, minor = (int(p) for p in coverage.version_info[:2])
    if (major, minor) < (7, 4):
        raise ImportError(
            f"--rank-coverage needs coverage 7.4 or newer, found {coverage.__version__}; "
            f"upgrade it with: {INSTALL_HINT}"
        )
