#!/usr/bin/env bash
# The GPU smoke run: what a user with one or more GPUs meets first, each step bounded, each
# writing its conformance report and log under OUT (default reports/gpu-smoke).
#   1. the README's main command as typed on a GPU machine (backend auto, --nproc 4):
#      NCCL for the world sizes the GPUs cover, gloo (with the GPUs hidden) above;
#   2. every check at world size 1 on NCCL (the CUDA-only checks among them);
#   3. Lightning's strategies through the adapter on NCCL at world size 1;
#   4. the harness tests of device ownership and of the torch internals, on this torch.
# It installs nothing: the torch, pytest and Hypothesis already installed are used (a GPU
# image often has its own torch and no network). Without an installed shardcheck, the
# checkout goes on PYTHONPATH with a generated dist-info that declares the pytest plugins.
# Exits non-zero if a step failed or ran out of time; on a machine without a GPU it says
# so and exits 0 after step 4 (the GPU steps report `environment`). STEPS (default all:
# "harness-tests readme nccl-world1 lightning-nccl") runs only the steps it names.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-reports/gpu-smoke}
PROFILE=${SHARDCHECK_PROFILE:-ci}
mkdir -p "$OUT"
if ! python3 -c "import importlib.metadata as m; m.version('shardcheck')" 2>/dev/null; then
    site=$(mktemp -d)
    mkdir -p "$site/shardcheck-0.dist-info"
    printf 'Metadata-Version: 2.1\nName: shardcheck\nVersion: 0\n' \
        >"$site/shardcheck-0.dist-info/METADATA"
    python3 - "$site/shardcheck-0.dist-info/entry_points.txt" <<'PY'
import sys, tomllib
plugins = tomllib.load(open("pyproject.toml", "rb"))["project"]["entry-points"]["pytest11"]
with open(sys.argv[1], "w") as out:
    out.write("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in plugins.items()))
PY
    export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null && nvidia-smi -L
python3 - <<'PY'
import sys, hypothesis, pytest, torch
cuda = torch.cuda.is_available()
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {cuda} "
      f"({torch.cuda.device_count() if cuda else 0} GPU), "
      f"NCCL {torch.cuda.nccl.version() if cuda else None}, hypothesis {hypothesis.__version__}, "
      f"pytest {pytest.__version__}, {__import__('os').cpu_count()} CPUs")
PY
gpus=$(python3 -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" || echo 0)
failed=()
# step NAME SECONDS PYTEST-ARGS...: one bounded pytest run; its last line is the verdict.
# A NAME ending in "?" reports findings only: its failure does not fail the script.
step() {
    local name=${1%\?} seconds=$2 findings_only=0
    [ "$1" != "$name" ] && findings_only=1
    shift 2
    case " ${STEPS:-harness-tests readme nccl-world1 lightning-nccl} " in
        *" $name "*) ;;
        *) return 0 ;;
    esac
    local began=$SECONDS rc=0
    timeout -s INT -k 20 "$seconds" python3 -m pytest -q -p no:cacheprovider "$@" \
        >"$OUT/$name.log" 2>&1 || rc=$?
    echo "gpu_smoke: $name: rc=$rc in $((SECONDS - began)) s: $(tail -n 1 "$OUT/$name.log")"
    [ "$rc" -eq 0 ] || [ "$findings_only" -eq 1 ] || failed+=("$name")
}
step harness-tests 120 tests/harness/test_rank_devices.py tests/harness/test_torch_compat.py
if [ "$gpus" -lt 1 ]; then
    echo "gpu_smoke: no CUDA GPU visible: the GPU steps need one (they report environment)"
    [ "${#failed[@]}" -eq 0 ] || exit 1
    exit 0
fi
step readme 240 suites/ --nproc 4 --hypothesis-profile="$PROFILE" --conformance-strict \
    --conformance-report "$OUT/readme"
step nccl-world1 180 suites/ --nproc 1 --backend nccl --hypothesis-profile="$PROFILE" \
    --conformance-strict --conformance-report "$OUT/nccl-world1"
if python3 -c "import lightning" 2>/dev/null; then
    # findings, not a failure (Lightning's known ones on CPU are listed in ci/field/)
    step 'lightning-nccl?' 150 suites/ --nproc 1 --backend nccl --hypothesis-profile="$PROFILE" \
        --strategy harness.adapters.lightning:make_strategy \
        --conformance-report "$OUT/lightning-nccl"
else
    echo "gpu_smoke: lightning-nccl: skipped, Lightning is not installed"
fi
if [ "${#failed[@]}" -gt 0 ]; then
    echo "gpu_smoke: failed: ${failed[*]} (logs in $OUT)" >&2
    exit 1
fi
echo "gpu_smoke: every step passed (logs and reports in $OUT)"
