#!/usr/bin/env bash
# Lint, type checks and the test suite (GPU tests skip themselves without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check kfbot tests bench
# mypy (one process, 40-50 s from a cold cache) checks beside the tests rather than
# before them: the tests keep both cores busy, so it costs them about half its time.
# Its report follows the tests'; either failing fails the run.
mypy_log=$(mktemp)
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT
# Without a GPU, two test files at a time (each file's tests stay in one process, as
# its module fixtures expect): much of the suite waits on nvcc, g++ and subprocesses,
# and one process left a 2-core machine a third idle (CI: 934 s serial, 671 s this
# way). With a GPU, one at a time: GPU tests time kernels and must not share the card.
workers=${KFBOT_TEST_WORKERS:-2}
if .venv/bin/python -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  workers=0
fi
tests=0
.venv/bin/python -m pytest -q -n "$workers" --dist loadfile --durations=25 "$@" || tests=$?
types=0
wait "$mypy_pid" || types=$?
cat "$mypy_log"
if [ "$tests" -ne 0 ]; then
  exit "$tests"
fi
exit "$types"
