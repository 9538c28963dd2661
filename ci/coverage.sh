#!/usr/bin/env bash
# Line and branch coverage of reference_impl by the suites alone, from every rank combined
# (--rank-coverage). Prints the figure and writes reports/rank-coverage/{coverage.txt,json}.
# Extra arguments go to pytest (for example --hypothesis-profile=ci). Runs unchanged on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
nproc=${SHARDCHECK_NPROC:-4}
start=$SECONDS
# --rank-coverage last: it takes an optional value
python -m pytest suites/ --nproc "$nproc" "$@" --rank-coverage-dir reports/rank-coverage \
    --rank-coverage
echo "suites under rank coverage took $((SECONDS - start)) s"
