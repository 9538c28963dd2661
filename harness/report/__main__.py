"""``python -m harness.report diff OLD NEW`` and ``... baseline REPORT_DIR``."""

from __future__ import annotations

import sys

from harness.report.diff import main

if __name__ == "__main__":
    sys.exit(main())
