#!/usr/bin/env bash
# The prepared device benchmark: Wan-1.3B geometry at 832x480 on one GPU, random weights, <= 8 minutes,
# then the presets' reference-parity tests on the GPU (bf16 autocast, CUDA attention backends).
#   benchmarks/gpu/run.sh                 # on a CUDA machine; JSON + PNG + parity log to $OUT (default outputs/gpu)
#   benchmarks/gpu/run.sh --dry-run       # the same code on the CPU, tiny geometry (CI; or VIDGEN_GPU_DRY_RUN=1)
# Run from the repository root or anywhere: it cd's there. It never downloads model weights: every
# weight is random.
#
# Installing. The lent GPU machine (Python 3.12, its own torch, no diffusers, no PyAV, no package
# registry) gets what it lacks as wheels carried with the tree: benchmarks/gpu/wheels.sh fills .whl/
# here, the device call names .whl in `carry`. When $VIDGEN_WHEELS (default .whl) holds wheels, they
# and a wheel of this tree (built with the machine's own setuptools, no index) are installed with
# `pip install --no-index --no-deps` into $VIDGEN_SITE (default /tmp/site), which goes first on
# PYTHONPATH. Without wheels: vidgen as installed, else `pip install -e .` (needs a registry).
set -euo pipefail
cd "$(dirname "$0")/../.."

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac  # used from other folders
WHEELS="${VIDGEN_WHEELS:-.whl}"
SITE="${VIDGEN_SITE:-/tmp/site}"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "benchmarks/gpu: installing $WHEELS/*.whl and this tree into $SITE (no index)" >&2
  built="$(mktemp -d)"
  [ -e build ] && had_build=1 || had_build=
  "$PY" -m pip wheel -q --no-index --no-deps --no-build-isolation --wheel-dir "$built" .
  [ -n "$had_build" ] || rm -rf build  # setuptools' scratch folder, if this made it
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$WHEELS"/*.whl "$built"/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
elif ! "$PY" -c "import vidgen.pipelines" >/dev/null 2>&1; then
  if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "benchmarks/gpu: torch missing, installing it from PyPI" >&2
    "$PY" -m pip install -q torch
  fi
  echo "benchmarks/gpu: installing vidgen (pip install -e .)" >&2
  "$PY" -m pip install -q -e .
fi
# from outside the tree: its vidgen/ folder alone is not the package (models/ and the rest map in)
(cd / && "$PY" -c "import vidgen.pipelines, sys; print('benchmarks/gpu: vidgen from', vidgen.__file__, file=sys.stderr)")

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # random weights only: nothing to download
export OUT="${OUT:-outputs/gpu}"
mkdir -p "$OUT"
"$PY" benchmarks/gpu/bench.py --out "$OUT" "$@"

# fidelity on the GPU: each preset's latents against the float64 reference of its published loop
dry=0
for arg in "$@"; do [ "$arg" = "--dry-run" ] && dry=1; done
[ -n "${VIDGEN_GPU_DRY_RUN:-}" ] && dry=1
if [ "$dry" = 0 ] && [ -z "${VIDGEN_GPU_SKIP_PARITY:-}" ]; then
  # the tests from a copy, so that the installed vidgen is imported, not this tree's vidgen/ folder
  scratch="$(mktemp -d)"
  cp -r tests "$scratch/"
  out="$(cd "$OUT" && pwd)"
  (cd "$scratch" && VIDGEN_PARITY_DEVICE=cuda VIDGEN_PARITY_AUTOCAST=bfloat16 "$PY" -m pytest -q -s \
    -p no:cacheprovider tests/pipelines/test_reference_parity.py -k "matches or resume" 2>&1 \
    | tee "$out/parity.log") || true
fi
