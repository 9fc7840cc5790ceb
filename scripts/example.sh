#!/usr/bin/env bash
# The main job on the bundled example repository (fixtures/example): list its kernels,
# then `kfbot optimize` them. The search runs on a copy in a temporary git repository,
# so this checkout is never written. Without a CUDA GPU it says so and shows the plan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/kfbot scan fixtures/example
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r fixtures/example "$work/example"
git -C "$work/example" init -q
git -C "$work/example" add -A
git -C "$work/example" -c user.name=kfbot -c user.email=kfbot@localhost commit -qm example
if .venv/bin/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
then
    .venv/bin/kfbot optimize --repo "$work/example" --budget 16 --islands 2 "$@"
else
    echo "no CUDA GPU here: this is what kfbot optimize would do (--dry-run)"
    .venv/bin/kfbot optimize --repo "$work/example" --dry-run "$@"
fi
