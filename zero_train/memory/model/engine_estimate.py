"""One engine on one set-up: its device bytes phase by phase, what DeepSpeed's offload moves to the host or NVMe,
the host bytes of building the model, whether it fits, and DeepSpeed's own estimate beside it.

    row = estimate_engine("ds3", shape, count, 8, per_node=8, usable_gpu_bytes=78e9, host_memory_bytes=None,
                          settings=OffloadSettings(), device="cuda", precision="bf16", micro_batch_size=1,
                          block_size=4096, grad_accum=1, gradient_checkpointing=True, ds_config={})

zero_train.memory.model.estimate runs it for every ZeRO stage of a set-up, `zero-train plan` for each set-up it
tries (memory.model.plan), an out-of-memory rank for its own (memory.oom).
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_train.memory.model import offload, theory
from zero_train.memory.model.deepspeed_estimate import deepspeed_model_states
from zero_train.memory.model.flat_partition import partition_of
from zero_train.memory.model.gpu_terms import gpu_margin, transient
from zero_train.memory.model.host_build import model_build_bytes
from zero_train.memory.model.peak import backend_for, engine_peak
from zero_train.memory.model.peak_terms import DeepSpeedSettings, Run
from zero_train.registry import engine_spec


@dataclass(kw_only=True, slots=True)
class StageEstimate:
    """One ZeRO stage on the set-up (bytes per rank unless named per node)."""

    stage: int
    engine: str
    paper_bytes: float
    """The ZeRO paper's model states (theory.paper_bytes)."""
    deepspeed_bytes: int | None
    """DeepSpeed's own estimator, per GPU (stages 2, 3; with the set-up's offload), None where it has none."""
    deepspeed_host_per_node_bytes: int | None
    """DeepSpeed's own estimator, host bytes per node (its 1.5 buffer factor included), None where it has none."""
    device_phases: dict[str, dict[str, int]]
    """Device bytes at each phase's highest point, by term (offloaded terms removed)."""
    device_peak_phase: str
    device_peak_bytes: int
    """The allocated peak our model predicts on the device."""
    boundary: dict[str, int]
    """Categories at the step boundary (as the probe attributes them) + one micro-batch's activations."""
    host_per_rank: dict[str, int]
    """Host bytes per rank while training, by term (offload; {} without)."""
    host_startup_per_rank: int
    """Host bytes per rank while train.py builds the model (host_build: the whole model in --load-dtype; ZeRO-3
    under zero.Init: nothing on a GPU's host; on CPU ranks its partition and the largest set gathered to
    initialise the weights, twice)."""
    host_per_node_bytes: int
    """Ranks on one node x the larger of training and start-up host bytes."""
    nvme_per_rank_bytes: int
    """Bytes per rank in NVMe swap files."""
    allocator_slack_bytes: int = 0
    """The caching allocator's slack for this stage's churned bytes, kept free on a GPU (gpu_terms); else 0."""
    fits_device: bool | None = None
    fits_host: bool | None = None

    @property
    def fits(self) -> bool | None:
        """Device and (if given) host fit; None without a device capacity."""
        if self.fits_device is None:
            return None
        return self.fits_device and self.fits_host is not False


def estimate_engine(
    engine: str,
    shape: theory.ModelShape,
    count,
    world_size: int,
    *,
    per_node: int,
    usable_gpu_bytes: int | None,
    host_memory_bytes: int | None,
    settings: offload.OffloadSettings,
    device: str,
    deepspeed_peer: bool = True,
    load_dtype: str = "fp32",
    gpu_slack: bool = True,
    **run,
) -> StageEstimate:
    """One engine of the peak model on one set-up: device phases, offload moved to the host, host bytes (the
    model's build in `load_dtype`: host_build), fits (our peak against `usable_gpu_bytes`, the GPU's memory minus
    the margin), and DeepSpeed's own estimate beside it (`deepspeed_peer`). `run`: precision, micro_batch_size,
    block_size, grad_accum, gradient_checkpointing, ds_config; `gpu_slack`: a GPU keeps the allocator's slack free
    too. estimate_setup calls it for each stage, `zero-train plan` for each set-up it tries."""
    spec = engine_spec(engine)
    stage = spec.stage
    model = engine_peak(
        engine,
        shape,
        world_size,
        backend=backend_for(device),
        activation_count=count,
        host_in_phases=False,
        **run,
    )
    phases, host, nvme = model.phases, {}, 0  # engine_peak moved the offloaded terms off the device
    if stage > 0 and settings.active:
        inputs = _offload_inputs(stage, shape, world_size, model.rank, run)
        host, nvme = offload.host_terms(inputs, settings), offload.nvme_bytes(inputs, settings)
    totals = {name: sum(terms.values()) for name, terms in phases.items()}
    peak_phase = max(totals, key=lambda name: totals[name])
    startup = model_build_bytes(
        spec, shape, world_size=world_size, load_dtype=load_dtype, precision=run["precision"], device=device
    )
    ranks_on_node = min(per_node, world_size)
    peer = _deepspeed_peer(shape, world_size, stage, per_node, settings) if deepspeed_peer else None
    trainable = shape.trainable_params if shape.frozen_base else None
    row = StageEstimate(
        stage=stage,
        engine=engine,
        paper_bytes=theory.paper_bytes(
            shape.num_params, world_size, stage, precision=run["precision"], trainable=trainable
        ),
        deepspeed_bytes=peer and peer.gpu_bytes,
        deepspeed_host_per_node_bytes=peer and peer.host_per_node_bytes,
        device_phases=phases,
        device_peak_phase=peak_phase,
        device_peak_bytes=totals[peak_phase],
        boundary=model.boundary,
        host_per_rank=host,
        host_startup_per_rank=startup,
        host_per_node_bytes=ranks_on_node * max(sum(host.values()), startup),
        nvme_per_rank_bytes=nvme,
    )
    if device == "cuda" and gpu_slack:
        slack = gpu_margin(world_size=world_size, transient_bytes=transient(phases[peak_phase]))
        row.allocator_slack_bytes = slack["allocator_slack"]
    if usable_gpu_bytes is not None:
        row.fits_device = row.device_peak_bytes + row.allocator_slack_bytes <= usable_gpu_bytes
    if host_memory_bytes is not None:
        row.fits_host = row.host_per_node_bytes <= host_memory_bytes
    return row


def _deepspeed_peer(shape, world_size: int, stage: int, per_node: int, settings: offload.OffloadSettings):
    """DeepSpeed's own estimate of the stage with the set-up's offload (stages 2 and 3 only), or None (also for
    LoRA: its estimators know no frozen base)."""
    if shape.frozen_base:
        return None

    moved = stage > 0 and settings.active
    return deepspeed_model_states(
        shape.num_params,
        world_size,
        stage,
        largest_layer_params=shape.largest_layer_params,
        gpus_per_node=min(per_node, world_size),
        offload_optimizer=settings.optimizer_device if moved else "none",
        offload_param=settings.param_device if stage == 3 else "none",
    )


def _offload_inputs(stage, shape, world_size, rank, run) -> offload.OffloadInputs:
    """The partition of the modelled rank (DeepSpeed's flat slices; ZeRO-3 splits every tensor)."""
    deepspeed = DeepSpeedSettings.from_config(run["ds_config"], stage)
    probe = Run(
        shape=shape,
        world_size=world_size,
        precision=run["precision"],
        micro_batch_size=run["micro_batch_size"],
        block_size=run["block_size"],
        deepspeed=deepspeed,
        grad_accum=run["grad_accum"],
    )
    return offload.rank_inputs(stage, probe, partition_of(shape, world_size, rank))
