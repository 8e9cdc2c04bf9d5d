#!/usr/bin/env bash
# The main job on the offline default: set up .venv (idempotent), then measure per-rank memory of the ZeRO
# ladder side by side, torch DDP, our ZeRO-1/2/3, DeepSpeed ZeRO-1/2/3 and torch FSDP2 (resharded), on 2 CPU
# ranks, and write the report (Markdown + PNG plots + JSON) to runs/demo/report/: bytes_per_param*.png puts
# the eight engines beside the ZeRO paper's lines, report.md's tables beside its numbers. Each part says how
# long it took (docs/setup.md: from a clean clone).
#   bash scripts/demo.sh                 # defaults below
#   ZT_DEMO_MODEL=tiny ZT_DEMO_PRECISION=bf16 ZT_DEMO_STEPS=5 ZT_DEMO_WORLD_SIZES=2,4 bash scripts/demo.sh
# None of these engines needs DeepSpeed's compiled CPU ops (CPUAdam is for optimizer offload; its shared-memory
# collectives serve inference only: zero_train/engines/deepspeed_engine.py), so set-up builds none here;
# scripts/test.sh's set-up builds them for the tests that use them.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds() { echo $(( $(date +%s) - $1 )); }
# CPU_S: CPU seconds of every finished child so far (bash's `times`, its second line: the children's user and
# system time; run in this shell, not in $(...), whose subshell has no children yet): the part of a duration
# that does not depend on what else the machine runs
cpu_now() {
  local file
  file=$(mktemp)
  times >"$file"
  CPU_S=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$file")
  rm -f "$file"
}
started=$(date +%s)
ZT_SETUP_DEEPSPEED_OPS=0 bash scripts/setup.sh
setup_s=$(seconds "$started")
cpu_now
cpu_before=$CPU_S
export ZT_OFFLINE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1
export PATH="$PWD/.venv/bin:$PATH"  # as an activated venv: its ninja, should a run build an op (setup.sh)
model=${ZT_DEMO_MODEL:-gpt2-25m}
precision=${ZT_DEMO_PRECISION:-fp32}
steps=${ZT_DEMO_STEPS:-2}  # the peak is reached at step 2 (the optimizer's state exists from step 1 on)
world_sizes=${ZT_DEMO_WORLD_SIZES:-2}
engines=ddp,zero1,zero2,zero3,ds1,ds2,ds3,fsdp2-z3
out=${ZT_DEMO_OUT:-runs/demo}
zt=.venv/bin/zero-train
mkdir -p "$out/estimate"
part=$(date +%s)
echo "[demo] 1/3 what theory says for $model, $precision, 2 ranks, micro-batch 2 x block 64 (the settings measured next)"
"$zt" config --stage 2 --precision "$precision" --micro-batch-size 2 --world-size 2 --model "$model" \
  -o "$out/estimate/ds_config.json"
"$zt" estimate --model "$model" --world-size 2 --config "$out/estimate/ds_config.json" \
  --micro-batch-size 2 --block-size 64 --device cpu
estimate_s=$(seconds "$part")
part=$(date +%s)
echo "[demo] 2/3 measuring 8 engines ($engines) x $world_sizes ranks, $steps steps each, one launch per world size, into $out"
"$zt" profile --model "$model" --world-sizes "$world_sizes" --engines "$engines" --launch once \
  --precision "$precision" --steps "$steps" --micro-batch-size 2 --block-size 64 --out "$out"
profile_s=$(seconds "$part")
part=$(date +%s)
echo "[demo] 3/3 report"
"$zt" report "$out" --out "$out/report"
report_s=$(seconds "$part")
echo "[demo] done: $out/report/report.md (the ladder: $out/report/bytes_per_param*.png)"
cpu_now
echo "[demo] took: set-up ${setup_s} s, estimate ${estimate_s} s, profile ${profile_s} s, report ${report_s} s;" \
  "$(seconds "$started") s in all; after set-up $(( $(seconds "$started") - setup_s )) s of wall time," \
  "$(( CPU_S - cpu_before )) CPU-s over all its processes (the 2 ranks' share of 2 cores: wall >= CPU-s / cores)"
