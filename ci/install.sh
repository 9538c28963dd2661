#!/usr/bin/env bash
# Install shardcheck and everything it needs into a fresh virtual environment (default .venv).
#
# torch goes first, pinned, and as the CPU build unless you ask for CUDA: an unpinned or
# default `pip install torch` on Linux pulls the CUDA build and several GB of CUDA packages.
#
#   bash ci/install.sh                          # CPU torch (the default)
#   SHARDCHECK_TORCH=cuda bash ci/install.sh    # CUDA torch (PyPI's Linux build; set
#                                               # PIP_INDEX_URL for another CUDA variant)
#
# On Linux the CPU build comes from PyTorch's CPU wheel index (TORCH_CPU_INDEX) when that
# index answers; without it (offline, a mirror-only network) the plain pin is installed from
# whatever pip is configured with (a local CPU wheel in --find-links, for instance), and the
# script warns if that turned out to be a CUDA build. Other settings: VENV (default .venv),
# TORCH_VERSION (default 2.13.0), TORCH_SPEC (a full requirement, overrides TORCH_VERSION),
# SHARDCHECK_EXTRAS (default dev,lightning; empty for none). Prints the torch command it runs;
# SHARDCHECK_DRY_RUN=1 prints it and stops before making anything.
#
# Last, ci/browser.sh installs Debian's chromium for the browser test of report.html where
# apt-get can and no browser is on PATH (SHARDCHECK_BROWSER=0 skips it); it never fails the
# install: without a browser that test reads environment.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
flavour=${SHARDCHECK_TORCH:-cpu}
spec=${TORCH_SPEC:-torch==${TORCH_VERSION:-2.13.0}}
cpu_index=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
extras=${SHARDCHECK_EXTRAS-dev,lightning}
case "$flavour" in
    cpu | cuda) ;;
    *)
        echo "ci/install.sh: SHARDCHECK_TORCH=$flavour: use cpu (the default) or cuda" >&2
        exit 2
        ;;
esac

# Whether the CPU index answers within a few seconds (pip itself would retry for minutes).
index_answers() {
    python3 - "$1" <<'PY'
import sys, urllib.request
from pathlib import Path
url = sys.argv[1].rstrip("/") + "/torch/"
if url.startswith("file://"):
    sys.exit(0 if Path(url.removeprefix("file://")).is_dir() else 1)
try:
    urllib.request.urlopen(url, timeout=5).close()
except Exception:
    sys.exit(1)
PY
}

torch_cmd=(python -m pip install --quiet "$spec")
if [ "$flavour" = cpu ] && [ "$(uname -s)" = Linux ]; then
    if index_answers "$cpu_index"; then
        torch_cmd+=(--index-url "$cpu_index")
    else
        echo "ci/install.sh: $cpu_index does not answer: installing $spec as pip is configured"
    fi
fi
echo "ci/install.sh: ${torch_cmd[*]}"
if [ "${SHARDCHECK_DRY_RUN:-0}" = 1 ]; then
    exit 0
fi
python3 -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
python -m pip install --quiet --upgrade pip
"${torch_cmd[@]}"
# the torch requirement again, so that resolving the project's own (a range) keeps the torch
# just installed instead of upgrading it (the torch matrix installs versions below the newest)
if [ -n "$extras" ]; then
    python -m pip install --quiet -e ".[$extras]" "$spec"
else
    python -m pip install --quiet -e . "$spec"
fi
SHARDCHECK_TORCH=$flavour SHARDCHECK_TORCH_SPEC=$spec python - <<'PY'
import os, hypothesis, pytest, torch
from packaging.requirements import Requirement
wanted = Requirement(os.environ["SHARDCHECK_TORCH_SPEC"])
if not wanted.specifier.contains(torch.__version__.split("+")[0], prereleases=True):
    raise SystemExit(f"ci/install.sh: asked for {wanted} but torch {torch.__version__} is "
                     "installed: the project's torch range excludes that version")
build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
print(f"installed: torch {torch.__version__} ({build} build), hypothesis "
      f"{hypothesis.__version__}, pytest {pytest.__version__}")
if os.environ["SHARDCHECK_TORCH"] == "cpu" and torch.version.cuda:
    print("ci/install.sh: warning: a CUDA build of torch was installed (the CPU index did not "
          "answer); it runs on CPU too, at the cost of its size")
PY
bash ci/browser.sh
