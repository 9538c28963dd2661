"""``python -m harness.rankcoverage DIR``: combine the data files in DIR and report.

For runs whose processes were measured without the pytest plugin combining them, such as
``torchrun`` ranks in attach mode that ran with ``SHARDCHECK_RANK_COVERAGE`` set.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from harness.rank.coverage_config import DEFAULT_SOURCE, parse_sources, require_coverage
from harness.rankcoverage.combine import combine_and_report


def main(argv: Sequence[str] | None = None) -> int:
    """Combine and report; exit status 0, or 2 for a bad directory or missing coverage.

    Args:
        argv: the command-line arguments (default: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(prog="python -m harness.rankcoverage", description=__doc__)
    parser.add_argument("directory", help="the data_dir the processes wrote their files to")
    parser.add_argument(
        "--sources",
        default=DEFAULT_SOURCE,
        metavar="PKG[,PKG]",
        help=f"the measured names, for the summary line (default {DEFAULT_SOURCE})",
    )
    args = parser.parse_args(argv)
    try:
        require_coverage()
        sources = parse_sources(args.sources)
    except (ValueError, ImportError) as exc:
        parser.error(str(exc))
    if not os.path.isdir(args.directory):
        parser.error(f"directory={args.directory!r} does not exist; give the data_dir of the run.")
    summary = combine_and_report(os.path.abspath(args.directory), sources)
    print(summary.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
