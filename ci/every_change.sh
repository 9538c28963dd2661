#!/usr/bin/env bash
# The every-change CI job: install from scratch, then the README's test command (ci profile).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
# shellcheck disable=SC1091
. "${VENV:-.venv}/bin/activate"
bash ci/test.sh --hypothesis-profile=ci
