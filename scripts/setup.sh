#!/usr/bin/env bash
# Creates .venv (once) with kfbot and its test tools. torch is pinned to the CPU build
# first: an unpinned torch requirement would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet torch==2.13.0
fi
.venv/bin/python -m pip install --quiet -e '.[dev]'
