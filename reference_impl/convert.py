"""Convert a sharded checkpoint into a full one: ``python -m reference_impl.convert SRC DST``.

Runs in one process without a process group (see
:func:`reference_impl.checkpoint.convert_sharded_to_full`). Exit status 0 on success, 1
when the conversion fails, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from collections.abc import Sequence
from typing import Any

import torch

from reference_impl.checkpoint import convert_sharded_to_full

__all__ = ["main"]


def _describe(key: str, value: Any) -> str:
    if isinstance(value, dict) and "param_groups" in value:
        return f"{key}: optimizer state ({len(value.get('state', {}))} parameters)"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return f"{key}: {len(value)} optimizer state(s) in standard form"
    tensors = isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values())
    if value and tensors:
        return f"{key}: {len(value)} tensors"
    return f"{key}: {type(value).__name__}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the converter from the command line.

    Args:
        argv: The arguments (default ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    parser = argparse.ArgumentParser(
        prog="python -m reference_impl.convert",
        description="Convert a sharded checkpoint directory (torch.distributed.checkpoint + "
        "meta.pt) into one full checkpoint file. No process group is needed.",
    )
    parser.add_argument("src", help="the sharded checkpoint directory")
    parser.add_argument("dst", help="the full checkpoint file to write (replaced if it exists)")
    args = parser.parse_args(argv)
    try:
        content = convert_sharded_to_full(args.src, args.dst)
    except (ValueError, OSError, RuntimeError, pickle.UnpicklingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.dst} from {args.src}:")
    for key, value in content.items():
        print(f"  {_describe(key, value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
