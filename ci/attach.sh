#!/usr/bin/env bash
# Attach mode on one node: torchrun starts SHARDCHECK_NPROC ranks (default 4; gloo on CPU,
# NCCL with one GPU per rank) and the suites run against the reference implementation through
# them, in strict mode, writing the conformance report to REPORT_DIR (default reports/attach).
# Checks that need another world size report "environment". Extra arguments go to pytest
# (for example --hypothesis-profile=ci). Runs unchanged on a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
nproc=${SHARDCHECK_NPROC:-4}
report=${REPORT_DIR:-reports/attach}
start=$SECONDS
python -m torch.distributed.run --nnodes 1 --nproc-per-node "$nproc" --max-restarts 0 \
    -m harness.attach -- pytest suites/ --conformance-strict --conformance-report "$report" "$@"
echo "attach mode ($nproc ranks) took $((SECONDS - start)) s"
