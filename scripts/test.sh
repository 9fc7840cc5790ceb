#!/usr/bin/env bash
# Lint, type checks and the test suite (GPU tests skip themselves without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check kfbot tests bench
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
