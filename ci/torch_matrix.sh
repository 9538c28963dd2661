#!/usr/bin/env bash
# The torch matrix: the conformance suites against the reference implementation with each
# torch version in TORCH_VERSIONS (default "2.11.0 2.12.1 2.13.0 2.14.1", the oldest first:
# every minor release the project supports), each in its
# own virtual environment .venv-torch-<version> (made by ci/install.sh, without extras, and
# kept for the next run while it still holds that torch), in strict mode, writing
# reports/torch-<version>/. Then each version's report is compared with the oldest one's
# (python -m harness.report diff). Extra arguments go to pytest (default
# --hypothesis-profile=ci: derandomized, so the versions meet the same examples and the diff
# shows torch's changes only); SHARDCHECK_NPROC sets the ranks (default 4) and SHARDCHECK_TORCH
# the build (cpu by default, see ci/install.sh). Fails if any version's suites fail; the
# oldest version that passes is pyproject.toml's lower bound for torch.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a versions <<<"${TORCH_VERSIONS:-2.11.0 2.12.1 2.13.0 2.14.1}"
nproc=${SHARDCHECK_NPROC:-4}
if [ "$#" -eq 0 ]; then
    set -- --hypothesis-profile=ci
fi
failed=()
for version in "${versions[@]}"; do
    venv=.venv-torch-$version
    # reuse the venv if it holds this torch and shardcheck (its pytest plugin entry points)
    if ! "$venv/bin/python" -c "import sys, importlib.metadata as m, torch
m.version('shardcheck')
sys.exit(torch.__version__.split('+')[0] != sys.argv[1])" "$version" 2>/dev/null; then
        rm -rf "$venv"
        start=$SECONDS
        VENV=$venv TORCH_VERSION=$version SHARDCHECK_EXTRAS='' bash ci/install.sh
        echo "torch_matrix: installed torch $version into $venv in $((SECONDS - start)) s"
    fi
    start=$SECONDS
    # the torch internals the project reads (harness/torch_compat.py), each exercised
    if ! "$venv/bin/python" -m pytest tests/harness/test_torch_compat.py -q -p no:cacheprovider \
        --nproc "$nproc"; then
        echo "torch_matrix: torch $version: harness/torch_compat.py FAILED" >&2
        failed+=("$version")
    fi
    if "$venv/bin/python" -m pytest suites/ --nproc "$nproc" --conformance-strict \
        --conformance-report "reports/torch-$version" "$@"; then
        echo "torch_matrix: torch $version: suites passed in $((SECONDS - start)) s"
    else
        echo "torch_matrix: torch $version: suites FAILED in $((SECONDS - start)) s" >&2
        failed+=("$version")
    fi
done
oldest=${versions[0]}
for version in "${versions[@]:1}"; do
    echo
    "$venv/bin/python" -m harness.report diff "reports/torch-$oldest/report.json" \
        "reports/torch-$version/report.json"
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "torch_matrix: the suites failed with torch ${failed[*]}" >&2
    exit 1
fi
echo "torch_matrix: the suites passed with torch ${versions[*]}"
