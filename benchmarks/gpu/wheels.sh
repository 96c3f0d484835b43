#!/usr/bin/env bash
# Fill .whl/ (or the folder given) with the wheels the lent GPU machine lacks for benchmarks/gpu/run.sh:
# it has Python 3.12, torch, transformers, peft, accelerate, matplotlib, safetensors and
# huggingface_hub, but no diffusers and no package registry. Run here, where PyPI is reachable;
# the device call then names .whl in `carry` (it and the tree must stay under 64 MiB together).
# diffusers is pure Python: the one wheel serves 3.12 there and this machine's Python in CI.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${1:-.whl}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
version="$("$PY" -c "import diffusers; print(diffusers.__version__)")"  # the version tested here
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" "diffusers==$version"
ls -l "$DEST"
