"""What a training run reports: the fixed step line, per-rank memory, a progress bar (the trackers, the JSONL
file among them: zero_train.train.tracking).

    step     10/100 | loss 6.1234 | lr 9.00e-04 | grad_norm 1.234 | tok/s   5321 | mem r0 12.3/15.0 MiB ...

Memory is the allocator's (zero_train.memory.measure: CUDA allocator stats, glibc mallinfo2 on CPU), per
rank, current/peak, gathered with the step's other values when the loop reads them (zero_train.train.step_values).
"""

from __future__ import annotations

import math
import sys

from tqdm.auto import tqdm

MIB = 2**20


def format_step_line(record: dict, max_steps: int) -> str:
    """The one fixed per-step line (rank 0): step, loss, lr, grad norm, tokens/s, memory per rank."""
    grad_norm = record["grad_norm"]
    norm_text = "n/a" if grad_norm is None else f"{grad_norm:.3f}"
    memory = " ".join(
        f"r{rank} {m['allocated_bytes'] / MIB:.1f}/{m['peak_bytes'] / MIB:.1f}"
        for rank, m in enumerate(record["memory"])
    )
    skipped = " | skipped" if record.get("skipped") else ""
    width = len(str(max_steps))
    return (
        f"step {record['step']:>{width}}/{max_steps} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
        f"grad_norm {norm_text} | tok/s {record['tokens_per_s']:7.0f} | mem MiB {memory}{skipped}"
    )


def format_eval_line(record: dict) -> str:
    """The evaluation line: held-out loss and perplexity."""
    return (
        f"eval step {record['step']} | eval_loss {record['eval_loss']:.4f} | ppl {record['perplexity']:.2f}"
    )


def perplexity(loss: float) -> float:
    """exp(loss), inf when it would overflow."""
    return math.exp(loss) if loss < 700 else float("inf")


def progress_bar(*, total: int, initial: int, enabled: bool):
    """A tqdm bar over optimizer steps on rank 0 when stderr is a terminal (not in logs), or None."""
    if not enabled or not sys.stderr.isatty():
        return None

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, leave=False)
