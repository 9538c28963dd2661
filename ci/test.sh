#!/usr/bin/env bash
# The README's test command: the project's own tests (harness, reference implementation,
# self-checks), then the conformance suites against the reference implementation in strict
# mode, writing the conformance report to reports/reference/. Extra arguments (for example
# --hypothesis-profile=ci) go to both pytest runs. pytest's exit code 5 ("no tests ran")
# fails the script like any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
python -m pytest tests/ --nproc 4 "$@"
echo "tests/ took $((SECONDS - start)) s"
start=$SECONDS
python -m pytest suites/ --nproc 4 --conformance-strict --conformance-report reports/reference "$@"
echo "suites/ took $((SECONDS - start)) s"
