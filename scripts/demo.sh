#!/usr/bin/env bash
# The main job on the offline default: set up .venv (idempotent), then measure per-rank memory of
# DDP, our ZeRO-1, torch ZeroRedundancyOptimizer and DeepSpeed ZeRO-1/2/3 on 2 CPU ranks, and write
# the report (Markdown + PNG plots + JSON) to runs/demo/report/. About 3 minutes on 2 cores.
#   bash scripts/demo.sh                 # defaults below
#   ZT_DEMO_MODEL=tiny ZT_DEMO_PRECISION=bf16 ZT_DEMO_STEPS=5 bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export ZT_OFFLINE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1
export PATH="$PWD/.venv/bin:$PATH"  # as an activated venv: its ninja, which built DeepSpeed's ops (setup.sh)
model=${ZT_DEMO_MODEL:-gpt2-25m}
precision=${ZT_DEMO_PRECISION:-fp32}
steps=${ZT_DEMO_STEPS:-3}
out=${ZT_DEMO_OUT:-runs/demo}
zt=.venv/bin/zero-train
mkdir -p "$out/estimate"
echo "[demo] 1/3 what theory says for $model, $precision, 2 ranks, micro-batch 2 x block 64 (the settings measured next)"
"$zt" config --stage 2 --precision "$precision" --micro-batch-size 2 --world-size 2 --model "$model" \
  -o "$out/estimate/ds_config.json"
"$zt" estimate --model "$model" --world-size 2 --config "$out/estimate/ds_config.json" \
  --micro-batch-size 2 --block-size 64 --device cpu
echo "[demo] 2/3 measuring 6 engines x 2 ranks ($steps steps each) into $out"
"$zt" profile --model "$model" --world-sizes 2 --engines ddp,zero1,torch-zero,ds1,ds2,ds3 \
  --precision "$precision" --steps "$steps" --micro-batch-size 2 --block-size 64 --out "$out"
echo "[demo] 3/3 report"
"$zt" report "$out" --out "$out/report"
echo "[demo] done: $out/report/report.md"
