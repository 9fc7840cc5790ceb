#!/usr/bin/env bash
# Creates .venv (once) with kfbot and its test tools. torch is pinned to the CPU build
# first: an unpinned torch requirement would pull several GB of CUDA packages.
# Installer output goes to .venv/setup.log and is shown only when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
log=.venv/setup.log
step() {
  if ! "$@" >>"$log" 2>&1; then
    echo "set-up failed: $*" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}
: >"$log"
step .venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  step .venv/bin/python -m pip install --quiet torch==2.13.0
fi
step .venv/bin/python -m pip install --quiet -e '.[dev]'
# The sandbox tests cover bubblewrap and unshare; a root CI machine gets bubblewrap here
# (without it those tests skip, saying so, and the unshare ones still run).
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  install_bwrap() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap; }
  if ! install_bwrap >>"$log" 2>&1 && ! { apt-get update -q && install_bwrap; } >>"$log" 2>&1
  then
    echo "set-up: could not install bubblewrap; its sandbox tests will be skipped" >&2
  fi
fi
