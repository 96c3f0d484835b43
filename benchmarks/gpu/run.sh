#!/usr/bin/env bash
# The prepared device benchmark: Wan-1.3B geometry at 832x480 on one GPU, random weights, <= 8 minutes.
#   benchmarks/gpu/run.sh                 # on a CUDA machine; JSON + PNG to $OUT (default outputs/gpu)
#   benchmarks/gpu/run.sh --dry-run       # the same code on the CPU, tiny geometry (CI; or VIDGEN_GPU_DRY_RUN=1)
# Run from the repository root or anywhere: it cd's there. On a fresh machine it installs vidgen
# (pip install -e .) when it is not importable, and torch only when torch is missing. It never
# downloads model weights: every weight is random.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c "import vidgen.pipelines" >/dev/null 2>&1; then
  if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "benchmarks/gpu: torch missing, installing it from PyPI" >&2
    "$PY" -m pip install -q torch
  fi
  echo "benchmarks/gpu: installing vidgen (pip install -e .)" >&2
  "$PY" -m pip install -q -e .
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # random weights only: nothing to download
export OUT="${OUT:-outputs/gpu}"
exec "$PY" benchmarks/gpu/bench.py --out "$OUT" "$@"
