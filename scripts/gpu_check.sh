#!/usr/bin/env bash
# The GPU rows nobody has measured yet (issue 20, docs/gpu.md): run this on a machine with 2+ CUDA GPUs.
#   bash scripts/gpu_check.sh                                  # into runs/gpu_check/ (not yet timed)
#   ZT_GPU_CHECK_MODEL=gpt2-25m ZT_GPU_CHECK_STEPS=6 ZT_GPU_CHECK_OUT=runs/gpu bash scripts/gpu_check.sh
# bf16 only where both GPUs run it natively (compute capability 8.0+; older ones emulate it): else fp32 alone.
# 1. our ZeRO-1 in bf16 (fp32 without it) on 2 GPUs (NCCL): checkpoint at step 2, resume to step 4, export
#    to a HF folder (the one-tensor-at-a-time gather through CPU, per-device RNG state, rank 0's waits);
# 2. `zero-train profile`, 2 ranks, every engine (ddp, our zero1/zero2, torch-zero, DeepSpeed ZeRO-1/2/3,
#    FSDP2 kept gathered / resharded), each precision, then `zero-train report`: the GPU memory rows
#    (allocated, reserved, outside the allocator);
# 3. `zero-train bench`, 2 ranks, one repeat each: every engine on the optimizer-bound scenario, and the
#    compute-bound scenario (gpt2-small's shape, 8 x 256 tokens per rank; docs/bench.md): the GPU speed rows.
# Send back the folder's report-*/, bench/bench.md, bench-compute/bench.md and logs/ (docs/gpu.md says where).
# Without 2 GPUs it prints one line and exits 2, having run nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${ZT_PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
need_two_gpus() {
  echo "gpu_check: needs 2 CUDA GPUs but $1 sees $2; run it on a GPU machine (nothing was run)" >&2
  exit 2
}
# the driver first (instant), then torch itself (a CPU-only torch build sees none either)
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)
[ "${gpus:-0}" -ge 2 ] || need_two_gpus nvidia-smi "${gpus:-0}"
gpus=$("$python" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' \
  2>/dev/null || echo 0)
[ "${gpus:-0}" -ge 2 ] || need_two_gpus torch "${gpus:-0}"
export ZT_DEVICE=cuda  # a mismatch (no GPU for a rank, a CPU process group) is an error, not a CPU run
unset DS_ACCELERATOR
export ZT_OFFLINE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
model=${ZT_GPU_CHECK_MODEL:-tiny}
steps=${ZT_GPU_CHECK_STEPS:-4}
out=${ZT_GPU_CHECK_OUT:-runs/gpu_check}
bin=$(dirname "$python")
zt="$bin/zero-train"
mkdir -p "$out/logs"
"$python" -c 'import torch, sys; [print(f"gpu {i}: {torch.cuda.get_device_name(i)}, "
  f"{torch.cuda.get_device_properties(i).total_memory / 2**30:.1f} GiB") for i in range(torch.cuda.device_count())];
  print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' \
  | tee "$out/logs/machine.txt"

# native bf16 on both GPUs (is_bf16_supported() alone also says yes where CUDA emulates it, slowly)
bf16=$("$python" -c 'import torch
def native(i):
    torch.cuda.set_device(i)
    return torch.cuda.is_bf16_supported(including_emulation=False)
print(int(all(native(i) for i in range(2))))')
if [ "$bf16" = 1 ]; then
  precisions=(fp32 bf16) mixed=bf16
else
  precisions=(fp32) mixed=fp32
  echo "[gpu_check] these GPUs have no native bf16 (compute capability < 8.0): fp32 only" | tee -a "$out/logs/machine.txt"
fi
precision_list=$(IFS=,; echo "${precisions[*]}")

echo "[gpu_check] 1/3 zero1 $mixed on 2 GPUs: save, resume, export"
train=(--engine zero1 --model "$model" --precision "$mixed" --block-size 64 --micro-batch-size 2 --no-progress
       --save-dir "$out/zero1/ckpt" --save-every 2)
rm -rf "$out/zero1"
"$bin/deepspeed" --num_gpus 2 scripts/train.py "${train[@]}" --max-steps 2 \
  --metrics-file "$out/zero1/metrics.jsonl" 2>&1 | tee "$out/logs/zero1-part1.log"
"$bin/deepspeed" --num_gpus 2 scripts/train.py "${train[@]}" --max-steps 4 --resume auto \
  --metrics-file "$out/zero1/metrics.jsonl" --export-hf "$out/zero1/hf" 2>&1 | tee "$out/logs/zero1-part2.log"

echo "[gpu_check] 2/3 memory: every engine, 2 ranks, $precision_list"
for precision in "${precisions[@]}"; do
  "$zt" profile --model "$model" --world-sizes 2 \
    --engines ddp,zero1,zero2,torch-zero,ds1,ds2,ds3,fsdp2-z2,fsdp2-z3 \
    --precision "$precision" --steps "$steps" --micro-batch-size 2 --block-size 64 --out "$out/profile-$precision"
  "$zt" report "$out/profile-$precision" --out "$out/report-$precision"
done

echo "[gpu_check] 3/3 speed, 2 ranks, $precision_list: every engine (optimizer-bound), ddp/zero1/ds1 (compute-bound)"
"$zt" bench --model "$model" --world-size 2 --precisions "$precision_list" --repeats 1 --steps $((steps + 2)) \
  --out "$out/bench"
"$zt" bench --scenario compute --world-size 2 --precisions "$precision_list" --repeats 1 --out "$out/bench-compute"
echo "[gpu_check] done: $out/report-*/report.md, $out/bench/, $out/bench-compute/, $out/logs/"
