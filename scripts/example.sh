#!/usr/bin/env bash
# The main job on the bundled example repository (fixtures/example).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/kfbot scan fixtures/example "$@"
