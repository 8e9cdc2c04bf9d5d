"""How long a bench will take, said before its first run starts.

A run is its start-up (an engine built, torn down) and its steps; a step of a compute-bound bench is forward and
backward, 6 FLOPs per parameter per token plus attention's 12 x layers x width x block per token (PaLM's count,
Chowdhery et al., 2022, appendix B; within 5% of torch's FLOP counter on our models: tests/bench), done by each
rank on one thread (run_logged's OMP_NUM_THREADS=1). The rate is measured here, now, under whatever load the
machine has: one thread's matmul of the model's width in each precision, times the share of that rate a whole
training step reaches (measured: docs/bench.md#how-long-a-bench-takes).
The optimizer step and the collectives are not counted apart: the fitted share absorbs them on the small models
it was fitted on; in an optimizer-bound bench of a large model they are most of a step and the figure is a floor.
"""

from __future__ import annotations

import os
import time

import torch

STEP_SHARE_OF_MATMUL = 0.34
"""A training step's FLOP rate / a bare matmul's on one thread, fitted on the step-time check's quiet calibration
launches and judged on others (docs/bench.md#how-long-a-bench-takes). Under load the probe sees part of the
slowdown, not all of it."""
RUN_START_S = 0.34
"""Per run in one launch: its model, engine and data built, torn down after (fitted as above: a run's wall time
less its steps)."""
LAUNCH_START_S = 4.6
"""Per launch, ranks within the cores: the launcher, the ranks' interpreters and imports, the process group,
the bench's own start and end (fitted as above: a launch's wall time less its runs'). Ranks beyond the cores
share them and stretch it as they stretch the steps; a first launch after boot reads its libraries from disk
and takes longer (docs/startup.md)."""
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def step_flops(meta: dict) -> float:
    """FLOPs of one rank's optimizer step: forward and backward over its micro-batch, times the accumulation;
    checkpointing runs the forward again in backward, 8 instead of 6 FLOPs per parameter per token (meta:
    bench_meta's; grad_accum and gradient_checkpointing optional)."""
    tokens = meta["micro_batch_size"] * meta["block_size"] * meta.get("grad_accum", 1)
    attention = 12 * meta["num_layers"] * meta["hidden_size"] * meta["block_size"]
    recompute = 8 / 6 if meta.get("gradient_checkpointing") else 1.0
    return tokens * (6 * meta["num_params"] + attention) * recompute


def matmul_rate(precision: str, width: int, *, seconds: float = 0.3) -> float:
    """FLOP/s of one thread multiplying width x width matrices in `precision`, measured for ~`seconds`."""
    width = max(64, min(width, 1024))
    a = torch.randn(width, width, dtype=getattr(torch, DTYPES[precision]))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a @ a  # the first call allocates and picks a kernel
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            a @ a
            count += 1
        elapsed = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    return 2 * width**3 * count / elapsed


def bench_seconds(meta: dict, runs: list[tuple[str, int]], *, launches: int = 1) -> dict:
    """The bench's predicted wall time, from this machine's measured matmul rate per precision.

    Args:
        meta: bench_meta's (num_params, num_layers, hidden_size, micro_batch_size, block_size, world_size).
        runs: (precision, optimizer steps) of every run.
        launches: launches the runs take (one, or one per run).

    Returns:
        dict(total_s, step_s per precision, rate per precision in FLOP/s).
    """
    share = max(1.0, meta["world_size"] / (os.cpu_count() or 1))  # ranks beyond the cores share them
    flops = step_flops(meta)
    rate = {p: matmul_rate(p, meta["hidden_size"]) for p in sorted({p for p, _ in runs})}
    step_s = {p: flops * share / (STEP_SHARE_OF_MATMUL * rate[p]) for p in rate}
    total = launches * LAUNCH_START_S * share + sum(RUN_START_S + steps * step_s[p] for p, steps in runs)
    return dict(total_s=total, step_s=step_s, rate=rate)


def duration_line(prediction: dict, runs: int) -> str:
    """ "bench: 36 runs, about 14 min here (a step 6.2 s in fp32, 31 s in bf16, at ...)"."""
    steps = ", ".join(
        f"{s:.2g} s per step in {p} ({prediction['rate'][p] / 1e9:.0f} GFLOP/s per thread)"
        for p, s in prediction["step_s"].items()
    )
    total = prediction["total_s"]
    when = f"{total / 60:.0f} min" if total >= 90 else f"{total:.0f} s"
    return f"bench: {runs} runs, about {when} on this machine as loaded now ({steps})"
