"""DeepSpeed offload (`offload_optimizer` / `offload_param`, cpu and nvme): what moves off the device, what the
host holds, from what DeepSpeed 0.19 allocates (file:function of deepspeed/runtime/ cited at each term).

Notation as in peak_terms: Psi parameters, N ranks, P = ceil(Psi / N) elements of a rank's partition, e bytes
per element of the model dtype, "touched" the elements of the whole tensors overlapping the partition.

ZeRO-1/2 (zero/stage_1_and_2.py, DeepSpeedZeroOptimizer): any offload_optimizer device sets `cpu_offload`
(nvme takes the same CPU path there). The optimizer's device becomes 'cpu':
    host    fp32 master partition 4P (__init__: `weights_partition ... .to(device=self.device)`),
            its fp32 gradient 4P (initialize_optimizer_states: `single_grad_partition`),
            DeepSpeedCPUAdam's two moments 8P (created on the partition's device at the first step),
            a 16-bit copy of the partition eP (__init__: `param_buffer_of_bit16_for_cpu_offload_groups`),
            one gradient staging buffer e x largest tensor (__init__: `temp_grad_buffer_for_cpu_offload`),
            with accumulation, each touched tensor's gradient e x touched
            (async_accumulate_grad_in_cpu_via_gpu: `accumulated_grads_in_cpu`)
    device  no masters, moments, fp32 or partition gradients; plus e x largest tensor
            (__init__: `temp_grad_buffer_for_gpu_offload`)
ZeRO-3 (zero/stage3.py, DeepSpeedZeroOptimizer_Stage3) with offload_optimizer cpu:
    host    fp32 master partition 4P and moments 8P (_create_fp32_partitions), fp32 gradient per sub-group
            4P (initialize_optimizer_states: `subgroup_gradient_buffer`), the gradient partitions eP
            (__init__: `grad_partitions_flat_buffer` on self.device = cpu)
  nvme: masters, moments and fp32 gradients go to the NVMe files (16P bytes per rank there); the host keeps
            `buffer_count` pinned swap buffers of the largest sub-group, 4 x min(P, sub_group_size) each
            (swap_tensor/optimizer_utils.py OptimizerSwapper.__init__: SwapBufferManager), and eP gradients.
ZeRO-3 offload_param cpu: the 16-bit partition lives in pinned host memory eP
            (_create_param_groups_fp16_flat_cpu_memory); tensors under the persistence threshold stay on
            the device. nvme: the host keeps min(P, max_in_cpu) of it plus `buffer_count` x `buffer_size`
            swap buffers (swap_tensor/partitioned_param_swapper.py AsyncPartitionedParameterSwapper.__init__).

Pinned (page-locked) or not (`pin_memory`), the bytes are the same; pinned bytes cannot be swapped out.
Host bytes per node = ranks on the node x host bytes per rank (no term is shared between ranks).

On a CPU-only run (`one_memory`) "device" and "host" are the same process memory: every host term is alive in
every phase beside the device's (they are allocated in DeepSpeed's __init__, the Adam moments at the first
step, the accumulation buffers at the first micro-batch, and none is freed before the run ends), so the
process's peak is the device's phase peak plus the host's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_train.memory.model.flat_partition import Partition
from zero_train.memory.model.peak_terms import FP32_BYTES, Run, loss_backward_moments

DEVICES = ("none", "cpu", "nvme")
OPTIMIZER_MOVES = (
    "master_params",
    "optimizer_states",
    "fp32_grads",
    "adamw_temporaries",
    "grad_partition_copy",
)
"""Device terms that move to the host with offload_optimizer (the optimizer steps there, DeepSpeedCPUAdam)."""
OFFLOAD_WORDS = {
    "offload_grad_buffer": "the device's gradient staging buffer",
    "param_copy": "a 16-bit copy of the partition",
    "grad_staging_buffer": "the host's gradient staging buffer",
    "nvme_swap_buffers": "NVMe swap buffers",
    "nvme_param_buffers": "NVMe parameter swap buffers",
}
"""Words for the offload terms (beside peak.TERM_WORDS)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class OffloadSettings:
    """A DeepSpeed config's offload settings (DeepSpeed's defaults where unset: offload_config.py)."""

    optimizer_device: str = "none"
    """zero_optimization.offload_optimizer.device: none, cpu or nvme."""
    param_device: str = "none"
    """zero_optimization.offload_param.device (ZeRO-3 only)."""
    optimizer_buffer_count: int = 4
    """offload_optimizer.buffer_count: NVMe swap buffers."""
    param_buffer_count: int = 5
    """offload_param.buffer_count."""
    param_buffer_size: int = 100_000_000
    """offload_param.buffer_size, elements per swap buffer."""
    max_in_cpu: int = 1_000_000_000
    """offload_param.max_in_cpu: parameter elements kept in host memory with nvme."""
    pin_memory: bool = True
    """offload_*.pin_memory (page-locked host memory)."""

    @property
    def active(self) -> bool:
        """Anything offloaded."""
        return self.optimizer_device != "none" or self.param_device != "none"

    @classmethod
    def from_config(cls, ds_config: dict | None) -> OffloadSettings:
        """Read `zero_optimization.offload_optimizer` / `offload_param` (None: no offload)."""
        zero = (ds_config or {}).get("zero_optimization", {}) or {}
        optimizer = zero.get("offload_optimizer") or {}
        param = zero.get("offload_param") or {}

        def number(section: dict, key: str, default: int) -> int:
            value = section.get(key, default)
            return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

        return cls(
            optimizer_device=str(optimizer.get("device") or "none"),
            param_device=str(param.get("device") or "none"),
            optimizer_buffer_count=number(optimizer, "buffer_count", 4),
            param_buffer_count=number(param, "buffer_count", 5),
            param_buffer_size=number(param, "buffer_size", 100_000_000),
            max_in_cpu=number(param, "max_in_cpu", 1_000_000_000),
            pin_memory=bool(optimizer.get("pin_memory", param.get("pin_memory", True))),
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class OffloadInputs:
    """What the offload terms are computed from (one rank)."""

    stage: int
    """ZeRO stage 1, 2 or 3."""
    partition: int
    """P, elements of the rank's partition."""
    touched: int
    """Elements of the whole tensors overlapping the partition (ZeRO-1/2)."""
    largest_tensor: int
    """Elements of the largest parameter tensor."""
    persistent: int
    """ZeRO-3: elements of the tensors kept whole (under stage3_param_persistence_threshold)."""
    element_bytes: int
    """e."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    sub_group_size: int = 1_000_000_000
    """ZeRO-3 sub_group_size."""
    log_softmax_bytes: int = 0
    """Beside the activations at log_softmax's backward (peak_terms.loss_backward_moments, the first moment)."""
    gather_bytes: int = 0
    """The step's all-gather output buffer (gloo: the whole 16-bit model; 0 on NCCL or one rank)."""
    param_partition: int | None = None
    """ZeRO-3: elements of the rank's 16-bit parameter partition when it differs from `partition` (LoRA: the
    frozen base is partitioned too, the optimizer's partition is the adapters'); None: `partition`."""

    @property
    def params_partitioned(self) -> int:
        """Elements of the rank's 16-bit parameter partition (ZeRO-3)."""
        return self.partition if self.param_partition is None else self.param_partition


def host_terms(inputs: OffloadInputs, settings: OffloadSettings) -> dict[str, int]:
    """Host bytes per rank while training (the terms of the module docstring; {} without offload)."""
    p, e = inputs.partition, inputs.element_bytes
    terms: dict[str, int] = {}
    if settings.optimizer_device != "none":
        if inputs.stage < 3 or settings.optimizer_device == "cpu":
            terms.update(
                master_params=FP32_BYTES * p, optimizer_states=2 * FP32_BYTES * p, fp32_grads=FP32_BYTES * p
            )
        else:
            group = min(p, inputs.sub_group_size)
            terms["nvme_swap_buffers"] = settings.optimizer_buffer_count * FP32_BYTES * group
        if inputs.stage < 3:
            terms["param_copy"] = e * p
            terms["grad_staging_buffer"] = e * inputs.largest_tensor
            if inputs.grad_accum > 1:
                terms["accumulated_grads"] = e * inputs.touched
        else:
            terms["grads"] = e * p
    if inputs.stage == 3 and settings.param_device == "cpu":
        terms["params"] = e * inputs.params_partitioned
    elif inputs.stage == 3 and settings.param_device == "nvme":
        terms["params"] = e * min(inputs.params_partitioned, settings.max_in_cpu)
        terms["nvme_param_buffers"] = e * settings.param_buffer_count * settings.param_buffer_size
    return terms


def nvme_bytes(inputs: OffloadInputs, settings: OffloadSettings) -> int:
    """Bytes per rank in NVMe swap files (ZeRO-3): masters, moments, fp32 gradients, 16-bit parameters."""
    if inputs.stage < 3:
        return 0
    optimizer = 4 * FP32_BYTES * inputs.partition if settings.optimizer_device == "nvme" else 0
    params = inputs.element_bytes * inputs.params_partitioned if settings.param_device == "nvme" else 0
    return optimizer + params


def device_phases(
    phases: dict[str, dict[str, int]], inputs: OffloadInputs, settings: OffloadSettings
) -> dict[str, dict[str, int]]:
    """The device's phases with offload: the moved terms dropped, the device-side buffers added."""
    moved = set(OPTIMIZER_MOVES) if settings.optimizer_device != "none" else set()
    result = {}
    for phase, terms in phases.items():
        kept = {name: value for name, value in terms.items() if name not in moved}
        if settings.optimizer_device != "none":
            _optimizer_offloaded(kept, phase, inputs)
        if inputs.stage == 3 and settings.param_device != "none" and "params" in kept:
            kept["params"] = inputs.element_bytes * inputs.persistent  # only the persistent tensors stay
        result[phase] = {name: value for name, value in kept.items() if value}
    return result


def _optimizer_offloaded(terms: dict[str, int], phase: str, inputs: OffloadInputs) -> None:
    """Gradient partitions go to the host: ZeRO-2's and ZeRO-3's held partition, ZeRO-1's at the step (it keeps
    whole gradients in backward); ZeRO-1/2 add the device staging buffer.

    ZeRO-1/2 also move the gradient norm from the step into backward (stage_1_and_2.py copy_grads_in_partition,
    at the boundary micro-batch: set_norm_for_param_grad_in_gpu takes `.to(get_norm_dtype()).norm(2)` of each
    tensor's piece in the partition, get_norm_dtype = torch.double in zero/utils.py): an 8-byte copy of the
    piece while its gradient is alive, for a few milliseconds (not modelled: on the CPU matrix cells, 1 ms
    sampling, it did not show beside the activations; docs/memory_matrix.md). The step (`step`, cpu_offload branch) then only clips the host's fp32 gradient in
    place, runs DeepSpeedCPUAdam in place on the host, copies the 16-bit partition and all-gathers it:
    no norm copy, no fp32 conversion, no AdamW temporaries on the device, only the gather's buffer."""
    e = inputs.element_bytes
    if inputs.stage >= 2:
        terms.pop(
            "accumulated_grads", None
        )  # accumulated on the host (accumulated_grads_in_cpu / the buffer)
    if inputs.stage == 3:
        terms["grads"] = 0
        return
    partition_grads = e * inputs.touched
    if inputs.stage == 2 or phase == "step":
        terms["grads"] = max(0, terms.get("grads", 0) - partition_grads)
    terms["offload_grad_buffer"] = e * inputs.largest_tensor
    if phase == "step":
        terms.pop("norm_fp64_copy", None)
        terms["gather_buffer"] = inputs.gather_bytes
    elif phase == "backward_start" and inputs.stage == 2:
        # ZeRO-2's start of backward was its first reduction, the larger moment while it allocated the gradient
        # partition on the device; without it, log_softmax's backward may be the larger again
        earlier = {
            name: terms[name] for name in ("params", "activations", "offload_grad_buffer") if name in terms
        }
        earlier["loss_gradients"] = inputs.log_softmax_bytes
        if sum(earlier.values()) > sum(terms.values()):
            terms.clear()
            terms.update(earlier)


HOST_CATEGORIES = {
    "master_params": "master_params",
    "optimizer_states": "optimizer_states",
    "fp32_grads": "grads",
    "grads": "grads",
    "accumulated_grads": "grads",
    "params": "params",
    "param_copy": "params",
    "grad_staging_buffer": "comm_buffers",
}
"""The probe's category of each host term (zero_train.engines.deepspeed_memory attributes the same buffers)."""


def rank_inputs(stage: int, run: Run, part: Partition) -> OffloadInputs:
    """The offload inputs of the rank owning `part` (DeepSpeed's flat slice; ZeRO-3 splits every tensor)."""
    persistent = sum(n for n in run.shape.param_numels if n < run.deepspeed.persistence_threshold)
    gather = run.element_bytes * run.trained if run.backend == "gloo" and run.world_size > 1 else 0
    return OffloadInputs(
        stage=stage,
        partition=part.elements,
        touched=part.touched,
        largest_tensor=run.largest_tensor,
        persistent=persistent,
        element_bytes=run.element_bytes,
        grad_accum=run.grad_accum,
        sub_group_size=run.deepspeed.sub_group_size,
        gather_bytes=gather,
        log_softmax_bytes=loss_backward_moments(run)[0],
        param_partition=-(-run.shape.num_params // run.world_size) if run.shape.frozen_base else None,
    )


def one_memory(phases: dict[str, dict[str, int]], host: dict[str, int]) -> dict[str, dict[str, int]]:
    """A CPU-only run's phases: the device's phases with every host term beside them (prefixed `host_`)."""
    named = {f"host_{name}": value for name, value in host.items() if value}
    return {phase: {**terms, **named} for phase, terms in phases.items()}


def host_boundary(
    boundary: dict[str, int], inputs: OffloadInputs, settings: OffloadSettings, *, one: bool
) -> dict[str, int]:
    """Categories at the step boundary with offload: the moved terms leave the device; on one memory (CPU
    runs, where the probe measures the process) the host's terms come back under the probe's categories."""
    result = dict(boundary)
    if settings.optimizer_device != "none":
        result.update(master_params=0, optimizer_states=0)
        if inputs.stage >= 2:
            result["grads"] = (
                0
                if inputs.stage == 3
                else max(0, result.get("grads", 0) - inputs.element_bytes * inputs.touched)
            )
        if inputs.stage < 3:
            result["comm_buffers"] = (
                result.get("comm_buffers", 0) + inputs.element_bytes * inputs.largest_tensor
            )
    if inputs.stage == 3 and settings.param_device != "none":
        result["params"] = inputs.element_bytes * inputs.persistent
    if one:
        for name, value in host_terms(inputs, settings).items():
            category = HOST_CATEGORIES.get(name, "comm_buffers")
            result[category] = result.get(category, 0) + value
    return result
