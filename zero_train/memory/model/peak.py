"""Our memory model: per rank, the bytes alive at the highest point of each phase of a step, and the peak.

The ZeRO paper (Rajbhandari et al. 2020, arXiv:1910.02054, sections 3.1 and 5.1) counts model states,
what a rank keeps between steps. A run fails at its PEAK: model states plus what lives only for part of
a step. For each engine of the profile matrix the phases hold (zero_train.memory.model.peak_engines, each term
from the code that allocates it and the bytes it was measured to add):

    forward         states at rest + activations + the logits (and their fp32 copy for the loss)
                    + ZeRO-3's gathered parameters (ours: the unit computing the logits)
    backward_start  at the LM head: every activation still saved + the loss's gradients + the LM
                    head's weight gradient (+ DeepSpeed's reduce bucket; ZeRO-2's gradient partition
                    from its first reduction on)
    backward_end    every gradient produced and not yet reduced (DDP, DeepSpeed ZeRO-1: whole) + a tied
                    embedding's two gradient contributions and their sum
    step            gradients still held + fp32 copies of 16-bit gradients + AdamW's temporaries
                    (+ DeepSpeed's fp64 copy for a gradient norm, on gloo its all-gather buffer)

peak = max over the phases. The paper's ZeRO-1 row counts whole 16-bit gradients (2 Psi) with K Psi/N:
so does our backward_end for DeepSpeed ZeRO-1, which is why its peak stays above the paper's 31.4 GB for
7.5e9 parameters on 64 ranks, while at the step boundary it holds only its gradient partition.

Gradient accumulation (grad_accum > 1): from the second micro-batch on, what the engine keeps between
micro-batches lives through forward and backward: whole gradients for DDP, torch's ZeRO and DeepSpeed
ZeRO-1 (param.grad until the boundary), ZeRO-2's gradient partition (every micro-batch reduces into it);
nothing more for our ZeRO-1 (its flat buffer is at rest anyway) and ZeRO-3 (its partition too); and
accumulating into an existing gradient keeps the new one of the largest tensor beside it. Activation
checkpointing: the saved activations shrink to the blocks' inputs, and the end of backward may peak while
the first block is recomputed (peak_terms.activation_terms).

The probe (zero_train.memory.probe) measures forward and backward as ONE phase ("forward") and the step
as another: MEASURED_PHASE maps ours onto them.

DeepSpeed offload (`offload_optimizer` / `offload_param` in ds_config, zero_train.memory.model.offload): the
device's phases lose what moves to the host and gain DeepSpeed's device staging buffer; on a CPU run
(backend gloo) the host IS the device, so every host term is added to every phase (`host_` terms). A GPU
answer keeps the two apart (zero_train.memory.model.estimate puts the host terms beside the device's).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from zero_train.memory.model import offload
from zero_train.memory.model.flat_partition import Partition, distinct_partitions, partition_of
from zero_train.memory.model.peak_engines import (
    ddp_phases,
    deepspeed_boundary,
    deepspeed_phases,
    zero1_phases,
    zero2_phases,
)
from zero_train.memory.model.peak_fsdp2 import fsdp2_boundary, fsdp2_phases
from zero_train.memory.model.peak_terms import ActivationTerms, DeepSpeedSettings, Run, activations
from zero_train.memory.model.peak_zero3 import zero3_phases
from zero_train.memory.model.sharder_layout import Share, sharder_layout, whole_tensor_layout
from zero_train.memory.model.theory import ModelShape
from zero_train.memory.model.versions import warn_if_versions_differ
from zero_train.registry import DEEPSPEED, ENGINES, EngineSpec, find_engine

warn_if_versions_differ()  # the terms below were measured with one torch and one DeepSpeed (README.md here)

PHASES = ("forward", "backward_start", "backward_end", "step")
MEASURED_PHASE = {
    "forward": "forward",
    "backward_start": "forward",
    "backward_end": "forward",
    "step": "step",
}
"""The probe's phase each of ours falls in (its "forward" phase runs forward and backward)."""
STATE_CATEGORIES = ("params", "grads", "master_params", "optimizer_states", "comm_buffers")
TERM_WORDS = {
    "params": "parameters",
    "grads": "gradients",
    "master_params": "fp32 master parameters",
    "optimizer_states": "Adam states",
    "comm_buffers": "communication buffers",
    "activations": "activations",
    "loss_temporaries": "logits and their fp32 copy",
    "loss_gradients": "the loss's gradients and the LM head's weight gradient",
    "tied_gradient_copies": "the tied embedding's gradient contributions",
    "grad_partition_copy": "the copy of the gradient partition",
    "fp32_grads": "fp32 gradients",
    "adamw_temporaries": "AdamW's temporaries",
    "gathered_params": "ZeRO-3's gathered parameters",
    "gather_buffer": "gloo's all-gather buffer",
    "norm_fp64_copy": "the fp64 copy a gradient norm takes",
    "accumulated_grads": "gradients kept from earlier micro-batches",
    "accumulating_gradient": "the new gradient being added to an accumulated one",
    "recomputed_block": "a checkpointed block's recomputed activations",
    "pending_grads": "gradients waiting for their bucket (our ZeRO-2) or unit (our ZeRO-3)",
    "reduce_scatter_buffer": "a unit's gradients on their way to the owners (our ZeRO-3)",
}
"""Words for every term of a phase (report sentences, estimate notes)."""
PHASE_MODELS = {
    model.__name__: model
    for model in (ddp_phases, zero1_phases, zero2_phases, zero3_phases, deepspeed_phases, fsdp2_phases)
}
"""The per-phase models an engine's `peak_model` (zero_train.registry) names."""


@dataclass(kw_only=True, slots=True, frozen=True)
class PeakModel:
    """Our model of one engine on one run: what the rank with the highest peak holds, phase by phase."""

    engine: str
    """An engine of zero_train.registry that has a per-phase model (modelled_engine)."""
    rank: int
    """The rank modelled (by default the one with the highest peak)."""
    phases: dict[str, dict[str, int]]
    """phase (PHASES) -> term -> bytes at that phase's highest point."""
    boundary: dict[str, int]
    """Categories at the step boundary (STATE_CATEGORIES + activations), as the probe attributes them."""

    @property
    def phase_bytes(self) -> dict[str, int]:
        """phase -> total bytes."""
        return {name: sum(terms.values()) for name, terms in self.phases.items()}

    @property
    def peak_phase(self) -> str:
        """The phase with the most bytes (the earlier one on ties)."""
        totals = self.phase_bytes
        return max(PHASES, key=lambda name: (totals[name], -PHASES.index(name)))

    @property
    def peak_bytes(self) -> int:
        """The predicted peak: the most any phase holds."""
        return self.phase_bytes[self.peak_phase]

    def as_dict(self) -> dict:
        """JSON-ready: engine, rank, peak_phase, peak_bytes, phase_bytes, phases, boundary."""
        return dict(
            engine=self.engine,
            rank=self.rank,
            peak_phase=self.peak_phase,
            peak_bytes=self.peak_bytes,
            phase_bytes=self.phase_bytes,
            phases=self.phases,
            boundary=self.boundary,
        )


def backend_for(device: str | None) -> str:
    """The collective backend a run on `device` uses: "gloo" on CPU, "nccl" otherwise."""
    return "gloo" if str(device or "cpu").startswith("cpu") else "nccl"


def _state(terms: dict[str, int]) -> dict[str, int]:
    return {name: terms.get(name, 0) for name in STATE_CATEGORIES}


def modelled_engine(engine: str | None) -> EngineSpec | None:
    """The registry entry of `engine` if our peak model has a per-phase model of it, else None."""
    spec = find_engine(engine)
    return spec if spec is not None and spec.peak_model is not None else None


def _undominated(items, fields) -> list:
    """The items (in rank order) that no lower rank matches or beats on both of `fields(item)`.

    Each rank-dependent term of an engine's phases grows with what the rank owns (its elements, its largest
    tensor or piece) and with nothing else, so its peak does too: a rank matched or beaten on both fields by a
    lower rank is never the one with the highest peak (ties go to the lower rank). The ranks left are few.
    """
    kept, front = [], []
    for item in items:
        first, second = fields(item)
        if not any(low_first >= first and low_second >= second for low_first, low_second in front):
            kept.append(item)
            front.append((first, second))
    return kept


@functools.lru_cache(maxsize=64)
def _deepspeed_ranks(shape: ModelShape, world_size: int, stage: int, optimizer_offloaded: bool) -> tuple:
    """The DeepSpeed ranks that may hold the highest peak, lowest first (cached, as distinct_partitions).

    ZeRO-3 splits every tensor over all ranks: every rank holds the same (rank 0 stands for all). ZeRO-1/2 ranks
    differ by the whole tensors their slice touches and their largest piece, and a rank holding more of both
    holds more (`_undominated`); with offload_optimizer the step's norm copy of a piece is gone from the device
    (offload._optimizer_offloaded), so only the touched tensors tell ranks apart, and not always upwards (offload
    moves the gradient partition's copy but not the tied embedding's copies, the larger of which the end of
    backward holds): one rank per number of touched elements, none dropped.
    """
    if stage == 3:
        return (partition_of(shape, world_size, 0),)
    parts = distinct_partitions(shape, world_size)
    if optimizer_offloaded:
        by_touched: dict[int, Partition] = {}
        for part in parts:
            by_touched.setdefault(part.touched, part)
        return tuple(by_touched.values())
    return tuple(_undominated(parts, lambda part: (part.touched, part.largest_piece)))


def _rank_models(
    spec: EngineSpec, run: Run, rank: int | None, *, optimizer_offloaded: bool = False
) -> tuple[list[tuple[PeakModel, Partition | None]], bool]:
    """Our model of `rank` (0 <= rank < N), else of every rank that may hold the highest peak: our ZeRO-1/2's
    equal slices and torch-zero's whole tensors (sharder_layout), DeepSpeed's partitions (the tensors each slice
    touches), one rank for DDP and FSDP2; each with its DeepSpeed partition (None for the others). And whether every rank
    holds the same (then the rank asked for stands for all)."""
    phases_of, engine = PHASE_MODELS[spec.peak_model], spec.name
    asked = rank is not None and 0 <= rank < run.world_size
    if spec.sharding == "per-tensor":  # FSDP2: every rank holds an even shard of every tensor: one model
        model = PeakModel(
            engine=engine, rank=0, phases=phases_of(run, spec.stage), boundary=_state(fsdp2_boundary(run))
        )
        return [(model, None)], True
    if spec.sharding == "flat" and not spec.ours:  # DeepSpeed's slices of one flat buffer
        alike = not run.shape.param_numels or run.world_size == 1
        if asked and not alike:
            parts = [partition_of(run.shape, run.world_size, rank)]
        else:
            parts = _deepspeed_ranks(run.shape, run.world_size, spec.stage, optimizer_offloaded)
        models = [
            PeakModel(
                engine=engine,
                rank=part.rank,
                phases=phases_of(run, spec.stage, part),
                boundary=_state(deepspeed_boundary(run, spec.stage, part)),
            )
            for part in parts
        ]
        return list(zip(models, parts, strict=True)), alike
    if spec.sharding == "replicated":
        layout, shares = None, [Share(rank=0, owned=run.trained, largest=run.largest_tensor)]
        alike = True
    else:  # ours: equal slices of one flat buffer; torch's ZeroRedundancyOptimizer: whole tensors
        layout = sharder_layout(run) if spec.sharding == "flat" else whole_tensor_layout(run)
        shares = [layout.share(rank)] if asked and not layout.alike else list(layout.shares)
        shares, alike = _undominated(shares, lambda share: (share.owned, share.largest)), layout.alike
    models = []
    for share in shares:
        phases = phases_of(run, share, layout)
        boundary = _state(phases["step"])  # the step's transients are not categories
        models.append((PeakModel(engine=engine, rank=share.rank, phases=phases, boundary=boundary), None))
    return models, alike


def engine_peak(
    engine: str,
    shape: ModelShape,
    world_size: int,
    *,
    precision: str,
    micro_batch_size: int,
    block_size: int,
    ds_config: dict | None = None,
    backend: str = "nccl",
    rank: int | None = None,
    grad_accum: int = 1,
    gradient_checkpointing: bool = False,
    activation_count: ActivationTerms | None = None,
    host_in_phases: bool | None = None,
) -> PeakModel:
    """Our per-phase model of one engine (the rank with the highest peak, or `rank`).

    Args:
        engine: an engine of zero_train.registry with a per-phase model (its `peak_model`).
        shape: the model (theory.model_shape; a bare parameter count gives no activations).
        world_size: N, the data-parallel ranks.
        precision: "fp32", "bf16" or "fp16".
        micro_batch_size, block_size: one micro-batch per step (T = their product tokens).
        ds_config: the DeepSpeed config (buckets, torch_adam, ZeRO-3 limits, offload); None: DeepSpeed's
            defaults.
        backend: "gloo" (CPU runs: with offload, host terms are added to the phases) or "nccl" (GPUs: the
            phases are the device's; offload.host_terms gives the host's).
        rank: model this rank (whole-tensor sharding and DeepSpeed's slices give ranks different shares);
            None: the rank with the highest peak.
        grad_accum: micro-batches per optimizer step.
        gradient_checkpointing: activation checkpointing (Hugging Face's, non-reentrant).
        activation_count: activations counted on the real architecture (anything with saved_bytes,
            loss_bytes, recompute_bytes, e.g. activations.count_activations's); None: GPT-2's formula.
        host_in_phases: with offload, add the host's terms to every phase (a CPU run measures one process
            memory); None: on gloo only. False keeps the phases the device's (estimate's device/host split).

    Returns:
        The PeakModel; .boundary["activations"] holds the activations of one micro-batch.

    Raises:
        ValueError: an unknown engine, or one without a per-phase model.
    """
    spec = modelled_engine(engine)
    if spec is None:
        known = ", ".join(spec.name for spec in ENGINES if spec.peak_model)
        raise ValueError(f"unknown engine {engine!r} to the peak model; one of {known}")
    settings = DeepSpeedSettings.from_config(ds_config, spec.stage)
    if activation_count is not None:
        activation_count = ActivationTerms(
            saved_bytes=activation_count.saved_bytes,
            loss_bytes=activation_count.loss_bytes,
            recompute_bytes=activation_count.recompute_bytes,
        )
    run = Run(
        shape=shape,
        world_size=world_size,
        precision=precision,
        micro_batch_size=micro_batch_size,
        block_size=block_size,
        deepspeed=settings,
        backend=backend,
        grad_accum=grad_accum,
        gradient_checkpointing=gradient_checkpointing,
        activation_count=activation_count,
    )
    settings_offload = offload.OffloadSettings.from_config(ds_config)
    moved = settings_offload.optimizer_device != "none"
    pairs, alike = _rank_models(spec, run, rank, optimizer_offloaded=moved)
    if spec.family == DEEPSPEED and settings_offload.active:
        one = run.backend == "gloo" if host_in_phases is None else host_in_phases
        pairs = [(_offloaded(model, run, part, settings_offload, one=one), part) for model, part in pairs]
    model = max((model for model, _ in pairs), key=lambda m: (m.peak_bytes, -m.rank))
    return PeakModel(
        engine=engine,
        rank=(rank or 0) if alike else model.rank,
        phases=model.phases,
        boundary=dict(model.boundary, activations=activations(run)),
    )


def _offloaded(
    model: PeakModel, run: Run, part: Partition, settings: offload.OffloadSettings, *, one: bool
) -> PeakModel:
    """`model` (of the rank owning `part`) with DeepSpeed's offload: the device's phases without what moved
    (offload.device_phases) and, on a CPU run (gloo: one memory), the host's terms beside them in every phase."""
    stage = find_engine(model.engine).stage
    inputs = offload.rank_inputs(stage, run, part)
    phases = offload.device_phases(model.phases, inputs, settings)
    if one:
        phases = offload.one_memory(phases, offload.host_terms(inputs, settings))
    boundary = offload.host_boundary(model.boundary, inputs, settings, one=one)
    return PeakModel(engine=model.engine, rank=model.rank, phases=phases, boundary=boundary)


def engine_categories(engine: str, shape: ModelShape, world_size: int, **settings) -> dict[str, int]:
    """Our model's categories at the step boundary (params, grads, master_params, optimizer_states,
    comm_buffers) plus one micro-batch's activations: what the probe attributes. Same arguments as
    `engine_peak`."""
    return engine_peak(engine, shape, world_size, **settings).boundary
