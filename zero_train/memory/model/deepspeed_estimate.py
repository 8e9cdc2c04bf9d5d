"""DeepSpeed's own model-state estimators, called (theory.py's answer (b)), with and without offload.

`estimate_zero2_model_states_mem_needs` and `estimate_zero3_model_states_mem_needs` are the functions DeepSpeed's
`*_all_live` / `*_all_cold` printers call. They assume mixed precision, count 18 bytes/param for the sharded part
(fp32 gradients too) and ZeRO-3's largest layer gathered; with `cpu_offload` (offload_optimizer) and, at stage 3,
`cpu_offload_params` (offload_param) they give the offloaded rows' GPU bytes and host bytes per node (their
1.5 buffer factor included). DeepSpeed has NO ZeRO-1 (or stage-0) estimator, none for NVMe, and none for
offload_param without offload_optimizer. Kept apart from theory.py because only files named deepspeed*.py import
DeepSpeed (pyproject's import contracts).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DeepSpeedEstimate:
    """What DeepSpeed's estimator answers for one stage and offload choice."""

    gpu_bytes: int
    """Per GPU."""
    host_per_node_bytes: int
    """Host ("per CPU" in DeepSpeed's printout) bytes of one node."""


def deepspeed_estimate(
    num_params: int, world_size: int, stage: int, *, largest_layer_params: int = 0
) -> int | None:
    """Per-GPU model-state bytes from DeepSpeed's own estimator without offload, or None for stages 0 and 1."""
    answer = deepspeed_model_states(num_params, world_size, stage, largest_layer_params=largest_layer_params)
    return None if answer is None else answer.gpu_bytes


def deepspeed_model_states(
    num_params: int,
    world_size: int,
    stage: int,
    *,
    largest_layer_params: int = 0,
    gpus_per_node: int | None = None,
    offload_optimizer: str = "none",
    offload_param: str = "none",
) -> DeepSpeedEstimate | None:
    """DeepSpeed's own estimate of the model states, or None where it has no estimator.

    Args:
        num_params: total parameters.
        world_size: GPUs over all nodes.
        stage: 2 or 3 have an estimator; 0 and 1 have none in DeepSpeed.
        largest_layer_params: ZeRO-3's largest layer (DeepSpeed adds 4 bytes/param of it).
        gpus_per_node: GPUs per node (default: all on one node); nodes = world_size / gpus_per_node.
        offload_optimizer: "none" or "cpu" ("nvme" at stage 2 takes DeepSpeed's CPU path, so its estimate).
        offload_param: stage 3: "none" or "cpu" (with offload_optimizer "cpu"); ZeRO-3 builds the model under
            zero.Init (zero_init=True, as scripts/train.py does).

    Returns:
        The DeepSpeedEstimate, or None (stages 0 and 1, NVMe at stage 3, offload_param alone).
    """
    per_node = gpus_per_node or world_size
    nodes = dict(num_gpus_per_node=per_node, num_nodes=world_size / per_node)
    cpu_offload = offload_optimizer != "none"
    if stage not in (2, 3) or (stage == 3 and "nvme" in (offload_optimizer, offload_param)):
        return None
    if stage == 3 and offload_param != "none" and not cpu_offload:
        return None
    estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs = load_estimators()
    if stage == 2:
        cpu_bytes, gpu_bytes = estimate_zero2_model_states_mem_needs(
            num_params, cpu_offload=cpu_offload, **nodes
        )
    else:
        cpu_bytes, gpu_bytes, _ = estimate_zero3_model_states_mem_needs(
            num_params,
            largest_layer_params,
            cpu_offload=cpu_offload,
            cpu_offload_params=offload_param != "none",
            zero_init=True,
            **nodes,
        )
    return DeepSpeedEstimate(gpu_bytes=int(gpu_bytes), host_per_node_bytes=int(cpu_bytes))


def load_estimators():
    """DeepSpeed's (estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs), imported."""
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs its accelerator choice to stdout on import
        # expensive: DeepSpeed (seconds), only for its estimator's column
        from deepspeed.runtime.zero import stage3, stage_1_and_2
    return stage_1_and_2.estimate_zero2_model_states_mem_needs, stage3.estimate_zero3_model_states_mem_needs
