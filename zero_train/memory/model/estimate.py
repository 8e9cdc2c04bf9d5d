"""One training set-up, every ZeRO stage: device bytes per rank phase by phase, host bytes per rank and per node.

    from zero_train.hf.models import model_config
    result = estimate_setup(model_config("llama-3-8b"), world_size=8, block_size=8192, gpu_memory_bytes=80e9,
                            gradient_checkpointing=True)
    result.stages[3].device_needed_bytes, result.stages[3].host_per_node_bytes, result.as_dict()

Parts: the activations counted on the real architecture (activations.count_activations, fake tensors), the
per-phase peak model of each engine (peak.engine_peak), DeepSpeed's offload (offload), the GPU headroom terms
(gpu_terms, assumed, not measured here) and the host memory our train.py needs to build the model. Used by
`zero-train estimate` and `zero-train plan`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from zero_train.memory.model import offload, theory
from zero_train.memory.model.gpu_terms import GpuHeadroom
from zero_train.registry import engine_spec, family_engines

STAGE_ENGINES = {
    0: "ddp",
    **{spec.stage: spec.name for spec in family_engines("deepspeed") if spec.stage > 0},
}
"""The engine our peak model uses for each stage: torch DDP, DeepSpeed ZeRO-1/2/3."""
PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(kw_only=True, slots=True)
class StageEstimate:
    """One ZeRO stage on the set-up (bytes per rank unless named per node)."""

    stage: int
    engine: str
    paper_bytes: float
    """The ZeRO paper's model states (theory.paper_bytes)."""
    deepspeed_bytes: int | None
    """DeepSpeed's own estimator (stages 2, 3; no offload), None where it has none."""
    device_phases: dict[str, dict[str, int]]
    """Device bytes at each phase's highest point, by term (offloaded terms removed)."""
    device_peak_phase: str
    device_peak_bytes: int
    """The allocated peak our model predicts on the device."""
    boundary: dict[str, int]
    """Categories at the step boundary (as the probe attributes them) + one micro-batch's activations."""
    headroom: dict[str, int]
    """GPU terms beside the allocated peak (gpu_terms; {} on CPU ranks)."""
    device_needed_bytes: int
    """device_peak_bytes + headroom: what the device must have."""
    host_per_rank: dict[str, int]
    """Host bytes per rank while training, by term (offload; {} without)."""
    host_startup_per_rank: int
    """Host bytes per rank while train.py builds the model (fp32 on the host before moving it; ZeRO-3 builds
    it partitioned under zero.Init: its largest tensor)."""
    host_per_node_bytes: int
    """Ranks on one node x the larger of training and start-up host bytes."""
    nvme_per_rank_bytes: int
    """Bytes per rank in NVMe swap files."""
    fits_device: bool | None = None
    fits_host: bool | None = None

    @property
    def fits(self) -> bool | None:
        """Device and (if given) host fit; None without a device capacity."""
        if self.fits_device is None:
            return None
        return self.fits_device and self.fits_host is not False


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
    device: str
    gpu_memory_bytes: int | None
    host_memory_bytes: int | None
    offload: dict
    activations: dict | None
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
    device: str = "cuda",
    gpus_per_node: int | None = None,
    gpu_memory_bytes: float | None = None,
    host_memory_bytes: float | None = None,
    stages: tuple[int, ...] = theory.STAGES,
) -> SetupEstimate:
    """Device and host bytes of every ZeRO stage for one training set-up.

    Args:
        model: a transformers PretrainedConfig (activations counted on its real architecture) or a bare
            parameter count (model states only).
        world_size: data-parallel ranks.
        precision: "fp32", "bf16" or "fp16".
        micro_batch_size, block_size: one micro-batch (block_size 0 with a config: its context length).
        grad_accum: micro-batches per optimizer step.
        gradient_checkpointing: HF activation checkpointing (non-reentrant) on every block.
        ds_config: DeepSpeed config (buckets, ZeRO-3 limits, offload applied to the DeepSpeed stages).
        device: "cuda" (GPU headroom terms added) or "cpu" (gloo ranks, no headroom).
        gpus_per_node: ranks per node (host bytes per node); default min(world_size, 8).
        gpu_memory_bytes: device capacity per rank: fits_device compares device_needed_bytes with it.
        host_memory_bytes: host memory per node: fits_host compares host_per_node_bytes with it.
        stages: the stages to estimate.

    Returns:
        The SetupEstimate.

    Raises:
        ValueError: offload in ds_config without host_memory_bytes (whether the host fits is the question).
    """
    settings = offload.OffloadSettings.from_config(ds_config)
    if settings.active and host_memory_bytes is None:
        raise ValueError(
            "offload needs the host's memory to say whether it fits: give --host-memory GB (per node)"
        )
    shape, count, block_size = _model_inputs(
        model, precision, micro_batch_size, block_size, gradient_checkpointing
    )
    per_node = gpus_per_node or min(world_size, 8)
    result = SetupEstimate(
        num_params=shape.num_params, world_size=world_size, gpus_per_node=per_node, precision=precision,
        micro_batch_size=micro_batch_size, block_size=block_size, grad_accum=grad_accum,
        gradient_checkpointing=gradient_checkpointing, device=device,
        gpu_memory_bytes=int(gpu_memory_bytes) if gpu_memory_bytes else None,
        host_memory_bytes=int(host_memory_bytes) if host_memory_bytes else None,
        offload=dict(optimizer=settings.optimizer_device, param=settings.param_device),
        activations=count.as_dict() if count is not None else None,
    )  # fmt: skip
    common = dict(precision=precision, micro_batch_size=micro_batch_size, block_size=block_size,
                  grad_accum=grad_accum, gradient_checkpointing=gradient_checkpointing,
                  ds_config=ds_config, device=device, settings=settings)  # fmt: skip
    for stage in stages:
        result.stages.append(
            estimate_engine(STAGE_ENGINES[stage], shape, count, world_size, per_node=per_node,
                            gpu_memory_bytes=result.gpu_memory_bytes,
                            host_memory_bytes=result.host_memory_bytes, **common)
        )  # fmt: skip
    result.notes = _notes(result, settings, count, ds_config)
    return result


def _model_inputs(model, precision: str, micro_batch_size: int, block_size: int, checkpointing: bool):
    """(ModelShape, ActivationCount or None, block size) of a config or a parameter count."""
    if isinstance(model, (int, float)):
        return theory.ModelShape(num_params=int(model)), None, 0
    # here, not at the top: a raw parameter count needs no torch; counting activations on a real config does
    import torch

    from zero_train.hf.models import max_context
    from zero_train.memory.model.activations import count_activations

    block = block_size or max_context(model)
    count = count_activations(model, micro_batch_size=micro_batch_size, block_size=block,
                              dtype=getattr(torch, PRECISION_DTYPES[precision]),
                              gradient_checkpointing=checkpointing)  # fmt: skip
    return theory.model_shape(model), count, block


def counted_activations(config, *, precision: str, micro_batch_size: int, block_size: int,
                        gradient_checkpointing: bool):  # fmt: skip
    """The ActivationCount of one micro-batch of a config (fake tensors), as estimate_setup counts it."""
    return _model_inputs(config, precision, micro_batch_size, block_size, gradient_checkpointing)[1]


def estimate_engine(
    engine: str,
    shape: theory.ModelShape,
    count,
    world_size: int,
    *,
    per_node: int,
    gpu_memory_bytes: int | None,
    host_memory_bytes: int | None,
    settings: offload.OffloadSettings,
    device: str,
    **run,
) -> StageEstimate:
    """One engine of the peak model on one set-up: device phases, offload moved to the host, GPU headroom,
    host bytes, fits. `run`: precision, micro_batch_size, block_size, grad_accum, gradient_checkpointing,
    ds_config. estimate_setup calls it for each stage, `zero-train plan` for each set-up it tries."""
    # here, not at the top: DeepSpeed imports in seconds and logs a line; `zero-train --help` and flag errors come before it
    from zero_train.memory.model.deepspeed_estimate import deepspeed_estimate
    from zero_train.memory.model.peak import backend_for, engine_peak

    stage = engine_spec(engine).stage
    model = engine_peak(engine, shape, world_size, backend=backend_for(device), activation_count=count,
                        host_in_phases=False, **run)  # fmt: skip
    phases, host, nvme = model.phases, {}, 0  # engine_peak moved the offloaded terms off the device
    if stage > 0 and settings.active:
        inputs = _offload_inputs(stage, shape, world_size, model.rank, run)
        host, nvme = offload.host_terms(inputs, settings), offload.nvme_bytes(inputs, settings)
    totals = {name: sum(terms.values()) for name, terms in phases.items()}
    peak_phase = max(totals, key=lambda name: totals[name])
    headroom = GpuHeadroom().terms(totals[peak_phase], world_size=world_size) if device == "cuda" else {}
    startup = 4 * (max(shape.param_numels, default=shape.num_params) if stage == 3 else shape.num_params)
    ranks_on_node = min(per_node, world_size)
    row = StageEstimate(
        stage=stage, engine=engine, paper_bytes=theory.paper_bytes(shape.num_params, world_size, stage,
                                                                   precision=run["precision"]),
        deepspeed_bytes=deepspeed_estimate(shape.num_params, world_size, stage,
                                                  largest_layer_params=shape.largest_layer_params),
        device_phases=phases, device_peak_phase=peak_phase, device_peak_bytes=totals[peak_phase],
        boundary=model.boundary, headroom=headroom,
        device_needed_bytes=totals[peak_phase] + sum(headroom.values()), host_per_rank=host,
        host_startup_per_rank=startup,
        host_per_node_bytes=ranks_on_node * max(sum(host.values()), startup), nvme_per_rank_bytes=nvme,
    )  # fmt: skip
    if gpu_memory_bytes is not None:
        row.fits_device = row.device_needed_bytes <= gpu_memory_bytes
    if host_memory_bytes is not None:
        row.fits_host = row.host_per_node_bytes <= host_memory_bytes
    return row


def _offload_inputs(stage, shape, world_size, rank, run) -> offload.OffloadInputs:
    """The partition of the modelled rank (DeepSpeed's flat slices; ZeRO-3 splits every tensor)."""
    # here, not at the top: only an offloading stage needs the partition arithmetic
    from zero_train.memory.model.flat_partition import partition_of
    from zero_train.memory.model.peak_terms import DeepSpeedSettings, Run

    deepspeed = DeepSpeedSettings.from_config(run["ds_config"], stage)
    probe = Run(shape=shape, world_size=world_size, precision=run["precision"],
                micro_batch_size=run["micro_batch_size"], block_size=run["block_size"], deepspeed=deepspeed,
                grad_accum=run["grad_accum"])  # fmt: skip
    return offload.rank_inputs(stage, probe, partition_of(probe, rank))


def _notes(result: SetupEstimate, settings: offload.OffloadSettings, count, ds_config) -> list[str]:
    notes = [
        "ours = our predicted PEAK per rank (zero_train.memory.model.peak): the largest of the end of forward, the "
        "start and the end of backward and the optimizer step; the paper and DeepSpeed count model states only",
        "stage 0 is torch DDP, stages 1-3 DeepSpeed ZeRO-1/2/3; ZeRO-1 holds whole gradients during backward "
        "(as the paper counts them) and only its partition at the step boundary",
        "DeepSpeed has no estimator for stages 0 and 1 (only estimate_zero2/zero3_model_states_mem_needs)",
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
    if result.precision == "fp32":
        notes.append("DeepSpeed's estimators assume mixed precision (18 bytes/param sharded) even for fp32")
    if ds_config is None:
        notes.append(
            "no DeepSpeed config: its defaults assumed (reduce bucket 5e8 elements, FusedAdam: no optimizer "
            "temporaries)"
        )
    if result.device == "cuda":
        notes.append(
            "GPU headroom (CUDA context 0.5 GB, caching allocator's reserve 10% of the peak, NCCL buffers 256 MiB) "
            "is ASSUMED from PyTorch's and NCCL's documentation, not measured: no GPU has run this code here"
        )
    if count is None:
        notes.append("a bare parameter count: no activations, loss tensors or largest tensor (give a model)")
    if settings.active:
        notes.append(
            f"offload (optimizer {settings.optimizer_device}, param {settings.param_device}) applies to DeepSpeed's "
            "stages; DDP (stage 0) has none; offload_param is ZeRO-3 only; ZeRO-1/2 treat nvme as cpu"
        )
    notes.append(
        "host bytes: what training allocates there (offload) or train.py's fp32 model build, whichever is larger; "
        "the Python process, CUDA's host-side state and the data pipeline are not counted"
    )
    return notes
