"""DeepSpeed offload, read from DeepSpeed itself: the CPU Adam kernel's JIT build, and the bytes of the buffers
its ZeRO optimizer allocates for `offload_optimizer` / `offload_param`, named as
zero_train.memory.model.offload names its terms (so the two can be compared term by term).

Attribute names are DeepSpeed 0.19.8's (runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer, runtime/zero/
stage3.py DeepSpeedZeroOptimizer_Stage3); a missing attribute counts zero.
"""

from __future__ import annotations

import os
import time

from zero_train.engines.base import tensor_bytes
from zero_train.engines.deepspeed_memory import attribute_tensors, tensors_in
from zero_train.runtime.extensions import clear_stale_locks

EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"
ZERO12_HOST = {
    "master_params": ("single_partition_of_fp32_groups",),  # __init__: weights_partition, on cpu
    "param_copy": ("param_buffer_of_bit16_for_cpu_offload_groups",),  # __init__: temp_buffer_bit16
    "grad_staging_buffer": ("temp_grad_buffer_for_cpu_offload",),  # __init__, largest tensor
    "accumulated_grads": ("accumulated_grads_in_cpu",),  # async_accumulate_grad_in_cpu_via_gpu
}
ZERO12_DEVICE = {"offload_grad_buffer": ("temp_grad_buffer_for_gpu_offload",)}  # __init__, largest tensor
ZERO3_HOST = {
    "master_params": ("fp32_partitioned_groups_flat",),  # _create_fp32_partitions
    "grads": ("grad_partitions_flat_buffer",),  # _setup_for_real_optimizer, on self.device = cpu
    "params": ("param_groups_fp16_flat_cpu_memory",),  # _create_param_groups_fp16_flat_cpu_memory
}


def build_cpu_adam(extensions_dir: str | os.PathLike) -> float:
    """JIT-build (or load the cached build of) DeepSpeedCPUAdam's kernel under `extensions_dir`.

    Args:
        extensions_dir: torch's extension cache (TORCH_EXTENSIONS_DIR) for this process and its children.

    Returns:
        Seconds the build or load took.

    A lock an interrupted build left is removed first (runtime.extensions.clear_stale_locks): the load would
    wait on it forever.
    """
    clear_stale_locks(extensions_dir)
    os.environ[EXTENSIONS_ENV] = str(extensions_dir)
    # expensive: DeepSpeed (seconds), needed only for the build; the attribution here reads attributes only
    from deepspeed.ops.op_builder import CPUAdamBuilder

    started = time.perf_counter()
    CPUAdamBuilder().load(verbose=False)
    return time.perf_counter() - started


def _named(obj, names: dict[str, tuple[str, ...]], seen: set) -> dict[str, int]:
    return {
        term: tensor_bytes(attribute_tensors(obj, attributes), seen) for term, attributes in names.items()
    }


def offload_buffers(ds_engine) -> dict[str, dict[str, int]]:
    """Bytes of DeepSpeed's offload buffers on this rank, by offload.py's term names.

    Args:
        ds_engine: the object deepspeed.initialize returned, after at least one optimizer step (the Adam
            states exist from the first step on).

    Returns:
        {"host": {term: bytes}, "device": {term: bytes}}; fp32_grads are the masters' .grad, optimizer_states
        the inner optimizer's state tensors.
    """
    zero = ds_engine.optimizer
    inner = getattr(zero, "optimizer", zero)
    seen: set = set()
    stage3 = hasattr(zero, "fp32_partitioned_groups_flat")
    host = _named(zero, ZERO3_HOST if stage3 else ZERO12_HOST, seen)
    masters = list(
        attribute_tensors(zero, ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"))
    )
    host["fp32_grads"] = tensor_bytes((master.grad for master in masters), seen)
    states = (value for state in getattr(inner, "state", {}).values() for value in tensors_in(state))
    host["optimizer_states"] = tensor_bytes(states, seen)
    device = {} if stage3 else _named(zero, ZERO12_DEVICE, seen)
    return dict(host={k: v for k, v in host.items() if v}, device={k: v for k, v in device.items() if v})
