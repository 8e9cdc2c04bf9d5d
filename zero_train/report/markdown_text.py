"""The fixed prose of report.md: what is measured and how, and which theories sit beside it."""

from __future__ import annotations

PREAMBLE = """\
## What is measured, and how

Each cell (engine x world size) is one real training run of `scripts/train.py` under the launcher
(`zero-train profile`), a few optimizer steps with AdamW; every rank measures itself:

- **Allocator level.** On CPU, glibc's `mallinfo2()` (bytes in use in the malloc arenas plus mmap-ed
  chunks), which tracks torch's CPU tensors to the byte; it does not see memory mapped outside malloc
  (Python's small-object arenas, shared-memory segments). On CUDA, the caching allocator's
  live-tensor bytes (`torch.cuda.memory_allocated`); NOT in that level, and recorded beside it in each
  run record's `cuda` entry: the allocator's cache (`max_memory_reserved` minus allocated), the CUDA
  context, NCCL's buffers and cuBLAS workspaces (`mem_get_info`: the device's used bytes minus reserved).
- **Categories** are taken at the last step boundary (gradients, optimizer states and buffers all
  alive) from the engines' own tensors: parameters, gradients, fp32 master parameters, optimizer
  states, communication buffers (DDP buckets, DeepSpeed's reduce bucket, our ZeRO-1's padding and ring
  buffer). **Activations** are the bytes autograd saves for backward in one micro-batch (saved-tensor
  hooks, each storage once). **other** is the rest of the allocator level (interpreter, libraries, data,
  unowned tensors): reported, never hidden. Per rank, the categories plus other equal the total exactly.
  Categories count only tensors on the measured device; tensors elsewhere (DeepSpeed's offloaded states
  in pinned host memory on a GPU run) are listed as off-device bytes, not subtracted from the device.
- **Peak** is the highest level seen in the run. On CPU it is sampled (every 1 ms and at every phase
  boundary), so it is a lower bound: a temporary shorter than the sampling interval can be missed. On
  CUDA it is the allocator's exact peak.
- **Communication** is the payload of every collective the rank issued in the last step (CommLedger,
  which patches torch's ProcessGroup methods and gives DDP a Python comm hook).

Numbers are per rank; MB = 1e6 bytes; Psi = number of parameters; B/param = bytes per parameter.
Memory ratios are estimate ÷ measured (1.00 exact, below 1 the estimate is too low); communication
ratios are measured ÷ paper."""


def theory_note(summary: dict) -> str:
    """Which theories the measured numbers are compared with, for the precisions present."""
    precisions = {group["precision"] for group in summary["groups"]}
    lines = [
        "## Theory beside the measurement",
        "",
        "- **Paper**: the ZeRO paper's model states (Rajbhandari et al. 2020, section 5.1), Psi parameters on "
        "N ranks.",
    ]
    if "fp32" in precisions:
        lines.append(
            "  fp32 runs use its pure-fp32 variant: 4 (params) + 4 (grads) + 8 (Adam) = 16 B/param; ZeRO-1 "
            "shards the 8, ZeRO-2 also the grads, ZeRO-3 everything."
        )
    if precisions - {"fp32"}:
        lines.append(
            "  16-bit runs use mixed-precision Adam, K = 12: DDP 2+2+12 = 16, ZeRO-1 4 + 12/N, "
            "ZeRO-2 2 + 14/N, ZeRO-3 16/N B/param."
        )
    lines += [
        "- **DeepSpeed**: DeepSpeed's own estimators (`estimate_zero2_model_states_mem_needs`, "
        "`estimate_zero3_...`), which assume mixed precision (18 B/param sharded, fp32 gradients included; "
        "ZeRO-3 adds the largest layer) whatever the run's precision. DeepSpeed has no estimator for stage 0 "
        "or 1: n/a.",
        "- **Ours**: `zero_train.memory.model.peak`, a per-phase peak model: for each engine, what the rank holds at "
        "the end of forward (activations, logits), at the start of backward (activations, the loss's "
        "gradients), at the end of backward (gradients before they are reduced: whole for DDP and DeepSpeed "
        "ZeRO-1, a tied embedding's gradient contributions) and in the optimizer step (fp32 gradient copies, "
        "AdamW's temporaries, gloo's all-gather buffer), on top of the model states as the engines really "
        "keep them (DeepSpeed's fp32 master partition even in fp32, DDP's gradient buckets, our ZeRO-1's "
        "padding and ring buffer); the peak is the largest phase. Its step-boundary categories are the "
        '"ours" column of the model-state table. It is what `zero-train estimate` prints.',
    ]
    return "\n".join(lines)
