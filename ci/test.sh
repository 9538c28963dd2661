#!/usr/bin/env bash
# The README's test command: the project's own tests, then the conformance suites against the
# reference implementation in strict mode. Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pytest tests/ --nproc 4 "$@"
python -m pytest suites/ --nproc 4 --conformance-strict "$@"
