"""Where a DeepSpeed engine's bytes are, read from its optimizer's own partitions and buffers.

Attribute names are DeepSpeed 0.19's (runtime/zero/stage_1_and_2.py, runtime/zero/stage3.py,
runtime/bf16_optimizer.py); a missing attribute counts zero, so other versions degrade to a larger
"other" in the memory report rather than to an error. Each storage is counted once, in the first
category that names it, in the order params, master_params, grads, optimizer_states, comm_buffers.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from zero_train.engines.base import tensor_bytes

# fp32 master partitions: ZeRO-1/2, ZeRO-3, BF16_Optimizer (bf16 + ZeRO-1 with fp32 grad accumulation)
MASTER_ATTRIBUTES = (
    "single_partition_of_fp32_groups",
    "fp32_partitioned_groups_flat",
    "fp32_groups_flat_partition",
)
# reduced / accumulated gradient partitions and flat gradient buffers
GRAD_ATTRIBUTES = (
    "averaged_gradients",  # ZeRO-1/2 (views or flat partitions), ZeRO-3 (views of the flat buffer)
    "grads_in_partition",  # ZeRO-2 contiguous gradient partition
    "grad_partitions_flat_buffer",  # ZeRO-3
    "fp32_groups_gradients_flat",  # BF16_Optimizer
    "fp32_groups_gradient_flat_partition",
    "accumulated_grads_in_cpu",  # ZeRO-1/2 offload_optimizer with accumulation: each touched tensor's gradient
)
# whole low-precision flat copies of the parameters
PARAM_ATTRIBUTES = (
    "bit16_groups_flat",
    "fp16_partitioned_groups_flat",
    "bf16_groups_flat",
    "param_buffer_of_bit16_for_cpu_offload_groups",  # ZeRO-1/2 offload_optimizer: a 16-bit partition copy
    "param_groups_fp16_flat_cpu_memory",  # ZeRO-3 offload_param: the 16-bit partition in host memory
)
# ZeRO-1/2 offload_optimizer's gradient staging buffers (largest tensor, on the host and on the device)
OFFLOAD_BUFFER_ATTRIBUTES = ("temp_grad_buffer_for_cpu_offload", "temp_grad_buffer_for_gpu_offload")


def tensors_in(value) -> Iterator[torch.Tensor]:
    """Every tensor inside `value` (a tensor, or lists/tuples/dicts of them, nested)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


def attribute_tensors(obj, names) -> Iterator[torch.Tensor]:
    """Every tensor inside the attributes `names` of `obj` (a missing attribute yields nothing)."""
    for name in names:
        yield from tensors_in(getattr(obj, name, None))


def _ipg_buffers(zero_optimizer) -> Iterator[torch.Tensor]:
    """The reduction bucket buffers ("ipg" = independent partition gradients), per comm dtype."""
    buckets = getattr(zero_optimizer, "ipg_buckets", None) or {}
    for bucket in buckets.values():
        yield from tensors_in(getattr(bucket, "buffer", None))


def deepspeed_memory_categories(ds_engine, device: torch.device | None = None) -> dict[str, int]:
    """Bytes this rank holds per category, for a DeepSpeed engine at any ZeRO stage.

    Args:
        ds_engine: the object deepspeed.initialize returned.
        device: count only tensors on this device (None: all); with offload_optimizer the fp32 masters
            and optimizer states sit in (pinned) host memory, not on the GPU.

    Returns:
        params, grads, master_params, optimizer_states, comm_buffers (bytes).
    """
    zero_optimizer = ds_engine.optimizer
    inner = getattr(zero_optimizer, "optimizer", zero_optimizer)  # the torch optimizer DeepSpeed wraps
    model_params = list(ds_engine.module.parameters())
    masters = list(attribute_tensors(zero_optimizer, MASTER_ATTRIBUTES))
    seen: set = set()
    params = tensor_bytes(model_params, seen, device=device)
    params += tensor_bytes(
        (getattr(p, "ds_tensor", None) for p in model_params), seen, device=device
    )  # ZeRO-3 partitions
    params += tensor_bytes(attribute_tensors(zero_optimizer, PARAM_ATTRIBUTES), seen, device=device)
    master_params = tensor_bytes(masters, seen, device=device)
    grads = tensor_bytes(attribute_tensors(zero_optimizer, GRAD_ATTRIBUTES), seen, device=device)
    grads += tensor_bytes((p.grad for p in model_params), seen, device=device)
    grads += tensor_bytes((m.grad for m in masters), seen, device=device)
    optimizer_states = tensor_bytes(
        (v for state in getattr(inner, "state", {}).values() for v in tensors_in(state)), seen, device=device
    )
    comm_buffers = tensor_bytes(_ipg_buffers(zero_optimizer), seen, device=device)
    comm_buffers += tensor_bytes(
        attribute_tensors(zero_optimizer, OFFLOAD_BUFFER_ATTRIBUTES), seen, device=device
    )
    return dict(
        params=params,
        grads=grads,
        master_params=master_params,
        optimizer_states=optimizer_states,
        comm_buffers=comm_buffers,
    )
