#!/usr/bin/env bash
# The nightly GPU job: the suites against the reference implementation on NCCL ranks (one GPU
# each) with the Hypothesis "nightly" profile (its example database lives in .hypothesis/,
# which the workflow keeps between runs), then Lightning Fabric's strategies through the
# adapter: on CPU ranks against the expected-failures file (ci/field.sh; the job fails when
# Lightning's behaviour changes), and on the GPUs as findings only. Then attach mode under
# torchrun (one node on the GPUs, and two simulated nodes on CPU ranks), coverage across
# ranks, and the torch matrix (the suites with each tested torch version, reports compared).
# On a runner with fewer GPUs than 4 (one GPU is the common case) the NCCL runs use as many
# ranks as there are GPUs (world size 1 on one GPU: the CUDA-only checks, Lightning's
# FSDPStrategy), and the world sizes above that run on gloo ranks, which see no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# CUDA builds of torch (ci/install.sh and ci/torch_matrix.sh install the CPU build otherwise);
# for another CUDA version point pip at its wheel index:
#   PIP_INDEX_URL=<your CUDA wheel index> bash ci/nightly.sh
export SHARDCHECK_TORCH=${SHARDCHECK_TORCH:-cuda}
bash ci/install.sh
# shellcheck disable=SC1091
. "${VENV:-.venv}/bin/activate"
gpus=$(python -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
nproc=${SHARDCHECK_NPROC:-$gpus}
if [ "$gpus" -lt 1 ]; then
    echo "nightly.sh: needs a CUDA GPU, found none (the CPU suites are ci/every_change.sh)" >&2
    exit 2
fi
python -m pytest suites/ --nproc "$nproc" --backend nccl --hypothesis-profile=nightly \
    --conformance-strict --conformance-report reports/nightly-reference
if [ "$nproc" -lt 4 ]; then
    # the world sizes the GPUs do not cover, on gloo ranks (the README's main command)
    python -m pytest suites/ --nproc 4 --backend gloo --hypothesis-profile=nightly \
        --conformance-strict --conformance-report reports/nightly-reference-gloo
fi
# the same suites with torchrun starting the ranks (attach mode: every world size up to
# torchrun's, as sub-worlds of its ranks)
SHARDCHECK_NPROC=$nproc REPORT_DIR=reports/nightly-attach bash ci/attach.sh \
    --backend nccl --hypothesis-profile=ci
# and as two nodes would: two torchrun agents of 2 ranks each on this host (c10d rendezvous on
# localhost, a shared directory), on gloo (both agents' local ranks would take the same GPUs);
# the sub-worlds of 3 and 4 ranks span both "nodes"
SHARDCHECK_NODES=2 SHARDCHECK_NPROC=4 REPORT_DIR=reports/nightly-attach-2nodes bash ci/attach.sh \
    --backend gloo --hypothesis-profile=ci
# coverage of reference_impl from every rank (ci profile: the figure, not the search)
SHARDCHECK_NPROC=$nproc bash ci/coverage.sh --backend nccl --hypothesis-profile=ci
# the field run: Lightning's strategies on gloo ranks (4, as measured for the expected-failures
# file ci/field/lightning-<version>.txt): red only when Lightning's behaviour changes
SHARDCHECK_NPROC=4 REPORT_DIR=reports/field-lightning bash ci/field.sh --backend gloo
# Lightning's strategies on the GPUs (FSDPStrategy runs only there): findings, not a failure
if ! python -m pytest suites/ --nproc "$nproc" --backend nccl --hypothesis-profile=nightly \
    --strategy harness.adapters.lightning:make_strategy --conformance-report reports/nightly-lightning; then
    echo "Lightning adapter run: nonconforming checks, see reports/nightly-lightning/report.md"
fi
# the planted bugs of the independent strategies (tests/independent): each one finding under
# its clause, on gloo ranks; the every-change job runs two of the nine
SHARDCHECK_NIGHTLY=1 python -m pytest tests/independent -q
# the torch matrix: every tested torch version in its own venv, reports diffed (ci profile)
SHARDCHECK_NPROC=$nproc bash ci/torch_matrix.sh --backend nccl --hypothesis-profile=ci
