"""The inputs `zero-train estimate` and `plan` answer for: one table, one refusal line per input.

The arithmetic takes any number; an answer for a number no machine has is noise (`--params 1e30` gave tables of
10^22 GB). Each bound is far past what exists, so no real set-up is refused, and names why. The CLI flags take
their bound from here (zero_train.cli.estimate / plan, through `check`), and so do the library's entry points.
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_train.runtime.parser import at_most


@dataclass(frozen=True, slots=True)
class Limit:
    """The largest value of one input, and why."""

    flag: str
    """The command-line flag that sets it."""
    maximum: float
    """The largest value answered."""
    why: str
    """What the bound stands for, in a few words."""


LIMITS = {
    "world_size": Limit("--world-size", 10_000_000, "100x the largest clusters built (~10^5 GPUs)"),
    "nodes": Limit("--nodes", 10_000_000, "100x the largest clusters built"),
    "plan_world_size": Limit(
        "--nodes x --gpus-per-node", 10_000_000, "100x the largest clusters built (~10^5 GPUs)"
    ),
    "gpus_per_node": Limit("--gpus-per-node", 1024, "one host memory; NVL72 racks hold 72 GPUs"),
    "params": Limit("--params", 1e14, "100 trillion parameters, ~50x the largest published models"),
    "model_params": Limit("the model's parameter count", 1e14, "100 trillion, ~50x the largest published"),
    "gpu_memory_gb": Limit("--gpu-memory", 10_000, "10 TB per GPU; the largest hold 288 GB"),
    "host_memory_gb": Limit("--host-memory", 100_000, "100 TB per machine; the largest hold tens of TB"),
    "block_size": Limit("--block-size", 10_000_000, "10M tokens, the longest context any model advertises"),
    "micro_batch_size": Limit(
        "--micro-batch-size", 1_000_000, "a million sequences per rank per micro-batch"
    ),
    "grad_accum": Limit("--grad-accum", 1_000_000, "a million micro-batches per step"),
    "global_batch_size": Limit("--global-batch-size", 1_000_000_000, "a billion sequences per step"),
}
"""Input name (as the library's arguments call it) -> its bound."""


def refusal(name: str, value: float) -> str | None:
    """The one-line reason `value` is refused for input `name`, or None when it is answered."""
    limit = LIMITS[name]
    if value <= limit.maximum:
        return None
    return (
        f"{limit.flag} {value:,.6g} is beyond what the estimate answers ({limit.maximum:,.6g}: {limit.why})"
    )


def check(**values: float | None) -> None:
    """Raise ValueError (one line) for the first input beyond its bound; None values are not given.

    Example: check(world_size=8, params=7.5e9).
    """
    for name, value in values.items():
        reason = None if value is None else refusal(name, value)
        if reason:
            raise ValueError(reason)


def flag_type(name: str, parse):
    """The argparse type of input `name`'s flag: `parse` (e.g. positive_int), then the bound."""
    limit = LIMITS[name]
    return at_most(parse, limit.maximum, limit.why)
