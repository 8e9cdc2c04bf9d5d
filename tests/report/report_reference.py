"""What tests/report/test_report.py checks the report against, computed here independently of the report: the
ZeRO paper's model states and traffic, DeepSpeed's ZeRO-2 estimate, our peak model of a cell, and the reading
of a cell's row in report.md."""

from __future__ import annotations

import torch

from zero_train.hf.models import model_config
from zero_train.memory.model import theory
from zero_train.memory.model.activations import count_activations
from zero_train.memory.model.peak import engine_peak


def cell_name(record: dict) -> str:
    return f"{record['engine']}-w{record['world_size']}-{record['precision']}"


def paper_fp32_bytes(num_params: int, world_size: int, stage: int) -> float:
    """The ZeRO paper's model states, pure fp32 Adam: params 4 + grads 4 + moments 8 bytes, sharded by stage."""
    shard = [world_size if stage >= k else 1 for k in (3, 2, 1)]  # params from stage 3, grads 2, moments 1
    return 4 * num_params / shard[0] + 4 * num_params / shard[1] + 8 * num_params / shard[2]


def deepspeed_zero2_bytes(num_params: int, world_size: int) -> int:
    """DeepSpeed's estimate_zero2_model_states_mem_needs (no offload): 2 Psi + 18 Psi / N."""
    return 2 * num_params + int(18 * num_params / world_size)


def comm_paper_unit(payload: dict, world_size: int) -> float:
    weights = dict(all_reduce=2, reduce_scatter=1, all_gather=1, broadcast=1, reduce=1)
    total = sum(payload.get(key, 0) * weight for key, weight in weights.items())
    return total + (
        payload.get("send_recv", 0) * world_size / (2 * (world_size - 1)) if world_size > 1 else 0
    )


def our_peak(cell: dict):
    """Our peak model of a cell, computed here from tiny's shape, its counted activations and the cell's
    settings."""
    config = model_config("tiny")
    counted = count_activations(config, micro_batch_size=2, block_size=32, dtype=torch.float32)
    return engine_peak(
        cell["engine"], theory.model_shape(config), cell["world_size"], precision="fp32", micro_batch_size=2,
        block_size=32, ds_config=cell["ds_config"], backend="gloo", activation_count=counted,
    )  # fmt: skip


def peak_minus_other(cell: dict) -> int:
    """The largest measured peak minus that rank's "other" between steps, over the ranks."""
    return max(rank["peak_bytes"] - rank["other_between_steps"] for rank in cell["ranks"])


def cell_other_drift(rank: dict) -> int:
    """How much more "other" a rank held at the step boundary than between steps."""
    return abs(rank["categories"]["other"] - rank["other_between_steps"])


def table_row(markdown: str, section: str, cell: str) -> list[str]:
    """The cells of `cell`'s row in the table under the `## section` heading."""
    body = markdown.split(f"## {section}")[1].split("\n## ")[0]
    line = next(line for line in body.splitlines() if line.startswith(f"| {cell} |"))
    return [part.strip() for part in line.strip("|").split("|")]
