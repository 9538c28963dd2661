"""``python -m harness.clauses [IDS] [--write FILE]``: print the contract, or write CONTRACT.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.clauses import UnknownClauseError, select
from harness.clauses.markdown import render_listing, render_markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.clauses", description=__doc__)
    parser.add_argument("ids", nargs="?", help="clause ids or globs, comma-separated (CKPT-*)")
    parser.add_argument("--write", metavar="FILE", help="write the Markdown contract to FILE")
    args = parser.parse_args(argv)
    if args.write:
        Path(args.write).write_text(render_markdown())
        print(f"wrote {args.write}")
        return 0
    try:
        ids = select(args.ids) if args.ids else None
    except UnknownClauseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render_listing(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
