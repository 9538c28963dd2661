#!/usr/bin/env bash
# The field run: Lightning Fabric's own strategies through the adapter, against every suite,
# with the findings known for the installed Lightning release listed as expected failures
# (ci/field/lightning-<version>.txt). It turns red only when Lightning's behaviour changes:
# a new failure, a listed one that now passes (strict xfail), or a listed late finding that
# went away. The report is written to ${REPORT_DIR:-reports/field-lightning}.
#
# Usage: bash ci/field.sh [extra pytest options]   (after bash ci/install.sh; CPU or GPUs)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
. "${VENV:-.venv}/bin/activate"
version=$(python -c "from importlib.metadata import version; print(version('lightning'))")
expected="ci/field/lightning-${version}.txt"
if [ ! -f "$expected" ]; then
    echo "ci/field.sh: no expected-failures file for Lightning $version ($expected); run" \
        "without it once and list the findings you accept, with reasons" >&2
    exit 2
fi
python -m pytest suites/ --nproc "${SHARDCHECK_NPROC:-4}" --hypothesis-profile=ci \
    --strategy harness.adapters.lightning:make_strategy \
    --expected-failures "$expected" \
    --conformance-report "${REPORT_DIR:-reports/field-lightning}" "$@"
