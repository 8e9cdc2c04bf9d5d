#!/usr/bin/env bash
# `zero-train gpu-check` on a GPU machine, from this checkout (docs/gpu.md): the acceptance run that asserts,
# sized to the machine (one GPU: every engine at world size 1; 2-8 GPUs: the multi-rank checks too).
#   bash scripts/gpu_check.sh                          # into runs/gpu_check/; exit 1 when a check fails
#   ZT_WHEELS=DIR bash scripts/gpu_check.sh            # first pip install --no-index --find-links DIR deepspeed
#                                                      # (DIR from scripts/gpu_wheels.sh: no network needed)
#   bash scripts/gpu_check.sh --out DIR --model tiny   # any flag of `zero-train gpu-check`
# Without a GPU it prints one line and exits 2 (`zero-train gpu-check --cpu` runs the same checks on CPU ranks).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${ZT_PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
if [ -n "${ZT_WHEELS:-}" ]; then
  "$python" -m pip install --quiet --no-index --find-links "$ZT_WHEELS" deepspeed
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout's zero_train, installed or not
export ZT_OFFLINE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
unset DS_ACCELERATOR
args=("$@")
[[ " $* " == *" --out "* ]] || args+=(--out "${ZT_GPU_CHECK_OUT:-runs/gpu_check}")
exec "$python" -m zero_train.cli.main gpu-check "${args[@]}"
