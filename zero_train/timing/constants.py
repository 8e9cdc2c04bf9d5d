"""Every constant of the step-time model, each with where its value comes from (one place: docs/steptime.md
shows what they give against measured runs).

Machine figures (peak FLOP rates, memory and link bandwidths) are the vendors' datasheets and live in
presets.py; what is here says how much of a peak a training step reaches, how collectives are costed and what
the engines' fixed choices are.
"""

from __future__ import annotations

MATMUL_EFFICIENCY = {
    "h100-sxm": 0.637,
    "h100-pcie": 0.637,
    "h200": 0.637,
    "a100-80": 0.697,
    "a100-40": 0.697,
    "l40s": 0.637,
    "rtx-4090": 0.637,
}
"""Fraction of a GPU's dense peak that a training step's matmuls reach (FSDP's communication interference and
kernel gaps included). FITTED on one published run per GPU and judged on the others (docs/steptime.md, "Against
published GPU runs"): H100 SXM on MosaicML's MPT-7B at 2,048 tokens, 8 GPUs (0.637); A100 80GB on torchtitan's
Llama 2 13B without checkpointing, 64 GPUs (0.697). H100 PCIe and H200 (the same Hopper SMs), A100 40GB, and L40S
and RTX 4090 (Ada: no published run here) take those values unfitted. cuBLAS alone reaches 75-85% on large
GEMMs; a step does less."""

ATTENTION_EFFICIENCY = 0.55
"""Fraction of the dense peak fused (flash) attention reaches, forward and backward together: FlashAttention-2
reports 50-73% of A100's peak forward and 35-63% backward (Dao 2023, arXiv:2307.08691, figures 4-6)."""

CAUSAL_FRACTION = 0.5
"""Share of attention's counted FLOPs a causal kernel executes: the counter counts the full s x s scores, a
causal kernel skips the blocks above the diagonal (FlashAttention-2 section 3.1.1)."""

MEMORY_EFFICIENCY = 0.70
"""Fraction of the HBM peak that unfused elementwise kernels (norms, activations, softmax, the loss) reach in
eager PyTorch (STREAM-like copies reach ~90%; small and strided kernels less)."""

LINK_EFFICIENCY = 0.80
"""Fraction of a link's unidirectional peak that NCCL's ring collectives reach as bus bandwidth (nccl-tests'
busbw on 8 x H100 NVLink: ~360-370 of 450 GB/s; on 400 Gb/s InfiniBand ~40-45 of 50 GB/s)."""

LAUNCH_LATENCY_S = {"intra": 10e-6, "inter": 25e-6}
"""Per collective call on GPUs: NCCL's small-message latency (nccl-tests all_reduce at 8 B: ~10-20 us inside a
node over NVLink, ~20-30 us across nodes over InfiniBand)."""

HOP_LATENCY_S = 1e-6
"""Per ring step of a collective (NCCL's LL protocol's per-hop latency is ~1 us; a ring of N ranks takes N-1
steps for an all-gather / reduce-scatter, 2(N-1) for an all-reduce, a tree 2 log2 N)."""

DDP_BUCKET_BYTES = 25 * 1024 * 1024
"""torch DDP's default bucket_cap_mb (25 MiB): its all-reduce calls per step (torch.nn.parallel.distributed)."""

DEEPSPEED_DEFAULT_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default reduce_bucket_size when no config sets one (zero/config.py, 5e8 elements)."""

DEEPSPEED_STAGE3_REUSE_ELEMENTS = 1_000_000_000
"""DeepSpeed ZeRO-3's stage3_max_reuse_distance and stage3_max_live_parameters defaults (zero/config.py, 1e9
each): after a module's forward it keeps a parameter gathered when the parameters fetched before its next use
number fewer than this (partitioned_param_coordinator.py). Forward runs the blocks in order and backward in
reverse, so the last fraction R / (2 N) of an N-parameter model's blocks stays gathered into backward: below
0.5B parameters DeepSpeed gathers once per step (the CommLedger measures 1 Psi on gpt2-25m, docs/bench.md)."""

GRAD_CLIP_BYTES_PER_PARAM = 12
"""Bytes the gradient clip reads and writes per parameter of a rank's gradient shard (fp32 at the clip in every
engine here): the norm reads it (4), the scale by min(1, max_norm / norm) reads and writes it (8). Every engine
clips (the generated configs' gradient_clipping 1.0): sharding/norms.py, DeepSpeed's unscale_and_clip_grads."""

OPTIMIZER_BYTES_PER_PARAM = {"fp32": 28, "bf16": 40, "fp16": 40}
"""Bytes AdamW reads and writes per parameter of a rank's shard in one step: fp32 param, grad, two moments
read (16) and param + moments written (12); mixed precision adds the 16-bit grad read and its fp32 copy
(4 + 2), and the 16-bit param written back (2) beside the fp32 master's (28 + 12)."""

OFFLOAD_PCIE_BYTES_PER_PARAM = {"fp32": 8, "bf16": 6, "fp16": 6}
"""Bytes per parameter of a rank's shard over PCIe per step under DeepSpeed's offload_optimizer: its gradient
down into the host's fp32 buffer (4) and the updated parameter up in the model's dtype (4 fp32, 2 bf16/fp16);
stage_1_and_2.py's cpu_offload path."""

CPU_ADAM_PARAMS_PER_S = 1.0e9
"""Parameters per second DeepSpeed's CPU-Adam updates on a GPU server's host: ASSUMED (order of magnitude:
ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840, section 4.2: CPU-Adam, AVX512 + OpenMP, up to 6.4x torch's CPU
Adam), not measured here; `zero-train calibrate` measures torch's AdamW on this machine's CPU instead."""

PCIE_EFFICIENCY = 0.80
"""Fraction of PCIe's peak that pinned host<->device copies reach (Gen4 x16: ~25 of 32 GB/s)."""
