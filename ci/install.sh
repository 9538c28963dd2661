#!/usr/bin/env bash
# Install shardcheck and everything it needs into a fresh virtual environment (default .venv).
# The pinned CPU torch wheel goes first: an unpinned torch pulls gigabytes of CUDA packages.
# On a GPU machine set TORCH_SPEC (for example "torch==2.13.0" from a CUDA index via
# PIP_INDEX_URL) before calling this script.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
python3 -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
python -m pip install --quiet -e '.[dev,lightning]'
python - <<'PY'
import hypothesis, pytest, torch
print(f"installed: torch {torch.__version__}, hypothesis {hypothesis.__version__}, pytest {pytest.__version__}")
PY
