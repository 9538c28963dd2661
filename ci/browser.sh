#!/usr/bin/env bash
# A browser for the test that lays out report.html's cost chart
# (tests/conformance/test_cost_report_browser.py): Debian's chromium, installed with apt-get
# where apt-get is available and no chromium or Chrome is on PATH. ci/install.sh runs it.
#
# Quiet, and it never fails: it prints one line when it installs chromium or cannot (no
# apt-get, not root and no password-less sudo, apt-get failed), and then that test reads
# environment. SHARDCHECK_BROWSER=0 skips it.
set -euo pipefail
for name in chromium chromium-browser google-chrome google-chrome-stable; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done
without() {
    echo "ci/install.sh: no chromium ($1): the browser test of report.html will read environment"
    exit 0
}
if [ "${SHARDCHECK_BROWSER:-1}" = 0 ]; then
    without "SHARDCHECK_BROWSER=0"
fi
if ! command -v apt-get >/dev/null 2>&1; then
    without "no apt-get"
fi
as_root=()
if [ "${EUID:-$(id -u)}" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
        as_root=(sudo -n)
    else
        without "not root, and no password-less sudo"
    fi
fi
apt() {
    ${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get -qq "$@" \
        >/dev/null 2>&1
}
# the package lists may be missing (a fresh container) or stale: update once if the first try fails
if apt install -y chromium || { apt update && apt install -y chromium; }; then
    echo "ci/install.sh: installed chromium (Debian's package) for the browser test of report.html"
else
    without "apt-get install chromium failed"
fi
