"""One training set-up, every ZeRO stage: device bytes per rank phase by phase, host bytes per rank and per node.

    from zero_train.hf.models import model_config
    result = estimate_setup(model_config("llama-3-8b"), world_size=8, block_size=8192, gpu_memory_bytes=80e9,
                            gradient_checkpointing=True)
    result.stages[3].device_peak_bytes, result.usable_gpu_bytes, result.stages[3].host_per_node_bytes

Parts: the activations counted on the real architecture (activations.count_activations, fake tensors), the
per-phase peak model of each engine (peak.engine_peak), DeepSpeed's offload (offload), the GPU margin taken off
the GPU's memory (gpu_terms, assumed, not measured here), the host memory our train.py needs to build the model,
and DeepSpeed's own estimators beside them (deepspeed_estimate). Used by `zero-train estimate` and `zero-train
plan`; the inputs are bounded (limits).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from zero_train.ds_config.keys import LOAD_DTYPES
from zero_train.memory.model import limits, offload, theory
from zero_train.memory.model.activations import count_activations
from zero_train.memory.model.engine_estimate import StageEstimate, estimate_engine
from zero_train.memory.model.gpu_terms import gpu_margin
from zero_train.registry import ENGINES

STAGE_ENGINES = {spec.stage: spec.name for spec in ENGINES if spec.stage_model}
"""The engine our peak model uses for each stage (the registry's stage_model): torch DDP, DeepSpeed ZeRO-1/2/3."""
PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DEFAULT_BLOCK_SIZE = 4096
"""Tokens per sample when none is given: the model's context, at most this (a 128k-context model is rarely
trained at full context, and its activations at 131,072 tokens fit nowhere)."""


@dataclass(kw_only=True, slots=True)
class SetupEstimate:
    """Every stage of one set-up, with the inputs and notes."""

    num_params: int
    world_size: int
    gpus_per_node: int
    precision: str
    micro_batch_size: int
    block_size: int
    grad_accum: int
    gradient_checkpointing: bool
    load_dtype: str
    """The dtype train.py builds the model in on the host (--load-dtype)."""
    device: str
    gpu_memory_bytes: int | None
    gpu_margin: dict[str, int]
    """Device bytes kept free beyond our peak whatever the set-up (gpu_terms: CUDA context, NCCL buffers; rules
    from published measurements), by term; {} on CPU ranks or without gpu_memory_bytes."""
    usable_gpu_bytes: int | None
    """gpu_memory_bytes minus the margin: what our peak plus each stage's allocator slack is compared with."""
    host_memory_bytes: int | None
    default_block_size: bool
    """No block size was given: the model's context, at most DEFAULT_BLOCK_SIZE."""
    offload: dict
    activations: dict | None
    trainable_params: int = 0
    """Parameters that get gradients, masters and optimizer states (LoRA: the adapters; else num_params)."""
    lora: dict | None = None
    """LoRA's r and target modules (None: full fine-tuning)."""
    stages: list[StageEstimate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def recommended_stage(self) -> int | None:
        """The lowest stage that fits (least communication), None if none does or nothing was compared."""
        return next((row.stage for row in self.stages if row.fits), None)

    def as_dict(self) -> dict:
        """JSON-ready, with each stage's `fits` and the recommended stage."""
        result = asdict(self)
        for row, stage in zip(result["stages"], self.stages, strict=True):
            row["fits"] = stage.fits
        result["recommended_stage"] = self.recommended_stage
        return result


def estimate_setup(
    model,
    *,
    world_size: int,
    precision: str = "bf16",
    micro_batch_size: int = 1,
    block_size: int = 0,
    grad_accum: int = 1,
    gradient_checkpointing: bool = False,
    ds_config: dict | None = None,
    load_dtype: str = "fp32",
    device: str = "cuda",
    gpus_per_node: int | None = None,
    gpu_memory_bytes: float | None = None,
    gpu_margin_bytes: float | None = None,
    host_memory_bytes: float | None = None,
    stages: tuple[int, ...] = theory.STAGES,
    engines: tuple[str, ...] | None = None,
    lora=None,
) -> SetupEstimate:
    """Device and host bytes of every ZeRO stage for one training set-up.

    Args:
        model: a transformers PretrainedConfig (activations counted on its real architecture) or a bare
            parameter count (model states only).
        world_size: data-parallel ranks.
        precision: "fp32", "bf16" or "fp16".
        micro_batch_size, block_size: one micro-batch (block_size 0 with a config: default_block_size).
        grad_accum: micro-batches per optimizer step.
        gradient_checkpointing: HF activation checkpointing (non-reentrant) on every block.
        ds_config: DeepSpeed config (buckets, ZeRO-3 limits, offload applied to the DeepSpeed stages).
        load_dtype: the dtype train.py builds the model in on the host (--load-dtype: "fp32" or "bf16").
        device: "cuda" (the GPU margin is kept free) or "cpu" (gloo ranks, no margin).
        gpus_per_node: ranks per node (host bytes per node); default min(world_size, 8).
        gpu_memory_bytes: device capacity per rank: fits_device compares our peak with it minus the margin.
        gpu_margin_bytes: the margin kept free on each GPU; None: gpu_terms.GpuMargin's rules.
        host_memory_bytes: host memory per node: fits_host compares host_per_node_bytes with it.
        stages: the stages to estimate (STAGE_ENGINES' engine for each).
        engines: the engines to estimate instead (any with a per-phase model: our zero1/zero2, fsdp2-z2, ...).
        lora: a zero_train.hf.lora.LoraSpec (needs a config): peft's adapters train, the base is frozen.

    Returns:
        The SetupEstimate.

    Raises:
        ValueError: an input beyond limits.LIMITS, a margin that leaves nothing of the GPU, or offload in
            ds_config without host_memory_bytes (whether the host fits is the question).
    """
    limits.check(
        world_size=world_size,
        micro_batch_size=micro_batch_size,
        block_size=block_size,
        grad_accum=grad_accum,
        gpus_per_node=gpus_per_node,
    )
    if load_dtype not in LOAD_DTYPES:
        raise ValueError(f"load dtype {load_dtype!r} is not one of {', '.join(LOAD_DTYPES)}")
    settings = offload.OffloadSettings.from_config(ds_config)
    if settings.active and host_memory_bytes is None:
        raise ValueError(
            "offload needs the host's memory to say whether it fits: give --host-memory GB (per node)"
        )
    shape, bare = _shape(model, lora), isinstance(model, (int, float))
    block = 0 if bare else block_size or default_block_size(model)
    count = (
        None
        if bare
        else counted_activations(
            model,
            precision=precision,
            micro_batch_size=micro_batch_size,
            block_size=block,
            gradient_checkpointing=gradient_checkpointing,
            lora=lora,
        )
    )
    per_node = gpus_per_node or min(world_size, 8)
    margin = _margin(device, gpu_memory_bytes, gpu_margin_bytes, world_size)
    result = SetupEstimate(
        num_params=shape.num_params,
        world_size=world_size,
        gpus_per_node=per_node,
        precision=precision,
        micro_batch_size=micro_batch_size,
        block_size=block,
        grad_accum=grad_accum,
        gradient_checkpointing=gradient_checkpointing,
        load_dtype=load_dtype,
        device=device,
        gpu_memory_bytes=int(gpu_memory_bytes) if gpu_memory_bytes else None,
        gpu_margin=margin,
        usable_gpu_bytes=int(gpu_memory_bytes) - sum(margin.values()) if gpu_memory_bytes else None,
        host_memory_bytes=int(host_memory_bytes) if host_memory_bytes else None,
        default_block_size=not bare and not block_size,
        offload=dict(optimizer=settings.optimizer_device, param=settings.param_device),
        activations=count.as_dict() if count is not None else None,
        trainable_params=shape.trainable_params,
        lora=None if lora is None else dict(r=lora.r, target_modules=lora.target_modules),
    )
    common = dict(
        precision=precision,
        micro_batch_size=micro_batch_size,
        block_size=block,
        grad_accum=grad_accum,
        gradient_checkpointing=gradient_checkpointing,
        ds_config=ds_config,
        device=device,
        settings=settings,
        load_dtype=load_dtype,
        gpu_slack=gpu_margin_bytes is None,
    )
    for engine in engines or tuple(STAGE_ENGINES[stage] for stage in stages):
        result.stages.append(
            estimate_engine(
                engine,
                shape,
                count,
                world_size,
                per_node=per_node,
                usable_gpu_bytes=result.usable_gpu_bytes,
                host_memory_bytes=result.host_memory_bytes,
                **common,
            )
        )
    result.notes = _notes(result, settings, count, ds_config)
    return result


def _margin(device: str, gpu_memory_bytes, gpu_margin_bytes, world_size: int) -> dict[str, int]:
    """The GPU margin's terms but the slack ({} on CPU ranks or without a GPU size); ValueError: nothing left."""
    if device != "cuda" or not gpu_memory_bytes:
        return {}
    margin = gpu_margin(world_size=world_size, margin_bytes=gpu_margin_bytes)
    margin.pop("allocator_slack", None)  # per stage: StageEstimate.allocator_slack_bytes
    if sum(margin.values()) >= gpu_memory_bytes:
        raise ValueError(
            f"a GPU margin of {sum(margin.values()) / 1e9:g} GB leaves nothing of {gpu_memory_bytes / 1e9:g} GB; "
            "give a smaller --gpu-margin"
        )
    return margin


def default_block_size(config) -> int:
    """Tokens per sample when none is given: the model's context, at most DEFAULT_BLOCK_SIZE."""
    from zero_train.hf.models import max_context  # expensive: transformers; estimate --params runs without it

    return min(max_context(config), DEFAULT_BLOCK_SIZE)


def _shape(model, lora=None) -> theory.ModelShape:
    """The ModelShape of a config (counted on the meta device, with LoRA's adapters if any; not for a bare count)
    or of a bare parameter count; ValueError when the count is beyond limits.LIMITS or below one."""
    if isinstance(model, (int, float)):
        if model < 1:
            raise ValueError(f"--params {model:g}: a model has at least one parameter")
        limits.check(params=model)
        return theory.ModelShape(num_params=int(model))
    shape = theory.model_shape(model, lora)
    limits.check(model_params=shape.num_params)
    return shape


def counted_activations(
    config, *, precision: str, micro_batch_size: int, block_size: int, gradient_checkpointing: bool, lora=None
):
    """The ActivationCount of one micro-batch of a config (fake tensors), as estimate_setup counts it."""
    return count_activations(
        config,
        micro_batch_size=micro_batch_size,
        block_size=block_size,
        dtype=getattr(torch, PRECISION_DTYPES[precision]),
        gradient_checkpointing=gradient_checkpointing,
        lora=lora,
    )


def _notes(result: SetupEstimate, settings: offload.OffloadSettings, count, ds_config) -> list[str]:
    notes = [
        "ours = our predicted PEAK per rank (zero_train.memory.model.peak): the largest of the end of forward, the "
        "start and the end of backward and the optimizer step; the paper and DeepSpeed count model states only",
        "stage 0 is torch DDP, stages 1-3 DeepSpeed ZeRO-1/2/3; ZeRO-1 holds whole gradients during backward "
        "(as the paper counts them) and only its partition at the step boundary",
        "DeepSpeed has no estimator for stages 0 and 1 (only estimate_zero2/zero3_model_states_mem_needs), none "
        "for NVMe at stage 3 and none for offload_param without offload_optimizer; DS host/node is its host "
        "estimate per node (its 1.5 buffer factor included)",
    ]
    if count is not None:
        notes.append(
            "activations counted on the model's real architecture (fake tensors, saved-tensor hooks): "
            f"{count.saved_bytes / 1e9:.3g} GB saved per micro-batch"
            + (
                f", {count.recompute_bytes / 1e9:.3g} GB recomputed per block"
                if count.recompute_bytes
                else ""
            )
        )
    if result.lora is not None:
        notes.append(
            f"LoRA r {result.lora['r']}: {result.trainable_params:,} adapter parameters train; the frozen base "
            "(whole, sharded under ZeRO-3) has no gradients, masters or optimizer states; the paper's rules are "
            "applied so; DeepSpeed's estimators count full fine-tuning only (left out)"
        )
    if result.precision == "fp32":
        notes.append("DeepSpeed's estimators assume mixed precision (18 bytes/param sharded) even for fp32")
    if ds_config is None:
        notes.append(
            "no DeepSpeed config: its defaults assumed (reduce bucket 5e8 elements, FusedAdam: no optimizer "
            "temporaries)"
        )
    if result.default_block_size:
        notes.append(
            f"no --block-size: {result.block_size:,} tokens per sample, the model's context at most "
            f"{DEFAULT_BLOCK_SIZE:,}; give --block-size to estimate another length"
        )
    if result.device == "cuda":
        notes.append(
            "the GPU margin (CUDA context, NCCL buffers by channels and peers, allocator slack by the bytes a "
            "step churns; docs/gpu.md) follows published measurements, not this project's: --gpu-margin GB "
            "sets your own"
        )
    if count is None:
        notes.append("a bare parameter count: no activations, loss tensors or largest tensor (give a model)")
    if settings.active:
        notes.append(
            f"offload (optimizer {settings.optimizer_device}, param {settings.param_device}) applies to DeepSpeed's "
            "stages; DDP (stage 0) has none; offload_param is ZeRO-3 only; ZeRO-1/2 treat nvme as cpu"
        )
    notes.append(
        f"host bytes: what training allocates there (offload) or train.py's model build in {result.load_dtype} "
        "(--load-dtype; ZeRO-3 builds under zero.Init, on the GPU), whichever is larger; the Python process, CUDA's "
        "host-side state and the data pipeline are not counted"
    )
    return notes
