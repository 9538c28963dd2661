#!/usr/bin/env bash
# Attach mode: torchrun starts SHARDCHECK_NPROC ranks (default 4; gloo on CPU, NCCL with one
# GPU per rank) and the suites run against the reference implementation through them, in
# strict mode, writing the conformance report to REPORT_DIR (default reports/attach). Every
# world size from 1 to SHARDCHECK_NPROC runs (sub-worlds of torchrun's ranks), so the checks
# are those of a local run with as many ranks. Extra arguments go to pytest (for example
# --hypothesis-profile=ci). Runs unchanged on a CPU machine.
#
# SHARDCHECK_NODES=2 simulates two nodes on this host: two torchrun agents of
# SHARDCHECK_NPROC/2 ranks each meet through a c10d rendezvous on localhost and share a
# temporary directory (--shared-dir), as two machines would. Pass --backend gloo there on a
# GPU machine: the two agents' local ranks would otherwise take the same GPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
nproc=${SHARDCHECK_NPROC:-4}
nodes=${SHARDCHECK_NODES:-1}
report=${REPORT_DIR:-reports/attach}
start=$SECONDS
if [ "$nodes" -eq 1 ]; then
    python -m torch.distributed.run --nnodes 1 --nproc-per-node "$nproc" --max-restarts 0 \
        -m harness.attach -- pytest suites/ --conformance-strict --conformance-report "$report" "$@"
    echo "attach mode ($nproc ranks) took $((SECONDS - start)) s"
    exit 0
fi
if [ $((nproc % nodes)) -ne 0 ]; then
    echo "ci/attach.sh: SHARDCHECK_NPROC=$nproc is not a multiple of SHARDCHECK_NODES=$nodes" >&2
    exit 2
fi
port=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
shared=$(mktemp -d)
trap 'rm -rf "$shared"' EXIT
pids=()
for node in $(seq 0 $((nodes - 1))); do
    python -m torch.distributed.run --nnodes "$nodes" --nproc-per-node $((nproc / nodes)) \
        --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "ci-attach-$port" \
        --max-restarts 0 -m harness.attach -- pytest suites/ --conformance-strict \
        --conformance-report "$report" --shared-dir "$shared" "$@" &
    pids+=("$!")
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=$?  # the node of global rank 0 exits with pytest's code
done
echo "attach mode ($nodes simulated nodes x $((nproc / nodes)) ranks) took $((SECONDS - start)) s"
exit "$status"
