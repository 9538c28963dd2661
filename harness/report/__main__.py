"""``python -m harness.report diff OLD.json NEW.json``."""

from __future__ import annotations

import sys

from harness.report.diff import main

if __name__ == "__main__":
    sys.exit(main())
