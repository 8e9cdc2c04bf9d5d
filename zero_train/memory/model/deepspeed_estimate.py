"""DeepSpeed's own model-state estimators, called (theory.py's answer (b)).

`estimate_zero2_model_states_mem_needs` and `estimate_zero3_model_states_mem_needs` are the functions DeepSpeed's
`*_all_live` / `*_all_cold` printers call. They assume mixed precision, count 18 bytes/param for the sharded part
(fp32 gradients too) and ZeRO-3's largest layer gathered; DeepSpeed has NO ZeRO-1 (or stage-0) estimator. Kept
apart from theory.py because only files named deepspeed*.py import DeepSpeed (pyproject's import contracts).
"""

from __future__ import annotations

import contextlib
import sys


def deepspeed_estimate(
    num_params: int, world_size: int, stage: int, *, largest_layer_params: int = 0
) -> int | None:
    """Per-GPU model-state bytes from DeepSpeed's own estimator (no offload), or None for stages 0 and 1.

    Args:
        num_params: total parameters.
        world_size: GPUs, counted as one node of `world_size` GPUs.
        stage: 2 or 3 have an estimator; 0 and 1 have none in DeepSpeed.
        largest_layer_params: ZeRO-3's largest layer (DeepSpeed adds 4 bytes/param of it).

    Returns:
        Bytes, or None where DeepSpeed has no estimator.
    """
    if stage not in (2, 3):
        return None
    # here, not at the top: DeepSpeed imports in seconds and logs a line; importing this module (report, estimate)
    # must not pay for it, nor a report of failed cells or a bad input, which never asks for stage 2 or 3
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs its accelerator choice to stdout on import
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    if stage == 2:
        _, gpu_bytes = estimate_zero2_model_states_mem_needs(
            num_params, num_gpus_per_node=world_size, num_nodes=1, cpu_offload=False
        )
        return int(gpu_bytes)
    if stage == 3:
        _, gpu_bytes, _ = estimate_zero3_model_states_mem_needs(
            num_params,
            largest_layer_params,
            num_gpus_per_node=world_size,
            num_nodes=1,
            cpu_offload=False,
            cpu_offload_params=False,
        )
        return int(gpu_bytes)
    return None
