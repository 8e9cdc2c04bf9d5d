"""One run record -> one comparison row: measured per-rank bytes next to the paper, DeepSpeed and ours.

Pure functions (no files, no plotting). Every ratio is estimate / measured: 1.00 is exact, below 1 the
estimate is too low. The row of a cell describes its REPORTED RANK, the rank with the highest measured
peak (the one that decides whether a run fits); every rank's own numbers stay in row["ranks"].

Row keys (summary.json's "cells"; zero_train.report.summary documents the file):
    cell, engine, zero_stage, world_size, precision, model, num_params, micro_batch_size, block_size,
    grad_accum, gradient_checkpointing, steps, tokens_per_s, error, reported_rank, ranks, categories,
    allocator_bytes, peak_bytes, baseline_bytes, bytes_per_param, model_states, ours_categories, ours_peak, paper_categories,
    footprint, peak, comm, notes (and explanations, added by zero_train.report.explain)

"ours" is zero_train.memory.model.peak: ours_categories its step-boundary categories (compared with the
measured categories), ours_peak its phases and peak (compared with the measured peak). Its activations are
counted on the record's architecture (zero_train.memory.model.activations) when the model can be rebuilt.

The headline accuracy is the prediction alone: ours vs the measured peak minus the measured "other" (the
interpreter, libraries, data: what no estimator predicts), `peak["ratio_without_other"]`, and
`peak["within_goal"]` says whether it is within PEAK_GOAL. "other" is reported beside it, with the part a
user can predict: the process's level before the model is built (`baseline`; ours + baseline vs the whole
peak). Ours + the measured other vs the peak is kept as `peak["ours_ratio"]` / `within_goal_with_other`,
labelled "old": it borrows "other" from the measurement itself
(docs/memory_matrix.md#the-headline-figure-the-prediction-alone).
"""

from __future__ import annotations

import torch

from zero_train.ds_config.keys import PRECISIONS
from zero_train.memory.model import theory
from zero_train.memory.model.activations import count_activations
from zero_train.memory.model.deepspeed_estimate import deepspeed_estimate
from zero_train.memory.model.peak import (
    MEASURED_PHASE,
    STATE_CATEGORIES,
    PeakModel,
    backend_for,
    engine_peak,
    modelled_engine,
)
from zero_train.memory.record import CATEGORIES, MODEL_STATE_CATEGORIES
from zero_train.registry import engine_names, find_engine
from zero_train.report.models import FactsLookup
from zero_train.report.traffic import comm_comparison
from zero_train.runtime.errors import UsageError

PEAK_GOAL = 0.10
"""Our estimate of the peak should be within 10% of the measured peak: the accuracy the report checks every
cell against (results: docs/memory_matrix.md)."""

GAP_FRACTION = 0.02
"""A gap worth explaining in words: at least 2% of the quantity compared (the accuracy target's tolerance)."""
MIN_GAP_BYTES = 64 * 1024
"""... and at least 64 KiB (smaller gaps are allocator noise)."""


def engine_label(engine: str) -> str:
    """The registry's words for `engine` (the name itself for an engine it does not know)."""
    spec = find_engine(engine)
    return spec.label if spec is not None else engine


def whole_tensor_sharded(engine: str) -> bool:
    """Whether `engine` gives whole tensors to owners (torch's ZeRO): ranks hold unequal shares."""
    spec = find_engine(engine)
    return spec is not None and spec.sharding == "whole-tensor"


def engine_index(engine: str | None) -> int:
    """The engine's place in tables (the registry's order; unknown engines last)."""
    names = engine_names()
    return names.index(engine) if engine in names else len(names)


def cell_name(record: dict) -> str:
    """The cell's name as `zero-train profile` writes it, e.g. `ds2-w2-fp32`, `ds2-w2-fp32-ga4-ckpt`."""
    accum = record.get("grad_accum") or 1
    return (
        f"{record['engine']}-w{record['world_size']}-{record['precision']}"
        + (f"-ga{accum}" if accum > 1 else "")
        + ("-ckpt" if record.get("gradient_checkpointing") else "")
    )


def cell_sort_key(record: dict) -> tuple:
    """Model, precision (fp32 first, as PRECISIONS), world size, then the engines by ZeRO stage."""
    precision = record.get("precision")
    precision_index = PRECISIONS.index(precision) if precision in PRECISIONS else len(PRECISIONS)
    return (
        str(record.get("model")),
        precision_index,
        str(precision),
        record.get("world_size") or 0,
        engine_index(record.get("engine")),
    )


def ratio(estimate: float | None, measured: float | None) -> float | None:
    """estimate / measured, or None when either is unknown or measured is zero."""
    if estimate is None or not measured:
        return None
    return estimate / measured


def is_large(gap: float, reference: float) -> bool:
    """Whether a gap of `gap` bytes is worth a sentence next to a quantity of `reference` bytes."""
    return abs(gap) >= MIN_GAP_BYTES and abs(gap) >= GAP_FRACTION * abs(reference)


def model_state_bytes(categories: dict) -> int:
    """Params + grads + fp32 master params + optimizer states: the ZeRO paper's "model states"."""
    return sum(categories[name] for name in MODEL_STATE_CATEGORIES)


def reported_rank(record: dict) -> dict:
    """The rank with the highest peak (the lowest rank number on ties)."""
    return max(record["ranks"], key=lambda rank: (rank["peak_bytes"], -rank["rank"]))


def _rank_row(rank: dict) -> dict:
    return dict(
        rank=rank["rank"],
        categories={name: rank["categories"][name] for name in CATEGORIES},
        model_state_bytes=model_state_bytes(rank["categories"]),
        allocator_bytes=rank["allocator_bytes"],
        peak_bytes=rank["peak_bytes"],
        baseline_bytes=rank.get("baseline_bytes"),
        phases=rank.get("phases", []),
        comm_bytes_per_step=rank.get("comm_bytes_per_step"),
        other_between_steps=rank.get("other_between_steps"),
        cuda=rank.get("cuda"),  # CUDA runs: reserved, outside the allocator, the run's maxima
        host_syncs_per_step=rank.get("host_syncs_per_step"),
        collectives_per_step=rank.get("collectives_per_step"),
        overlap=rank.get("overlap"),
    )


def _meta(record: dict) -> dict:
    keys = ("engine", "zero_stage", "world_size", "precision", "model", "num_params", "micro_batch_size")
    row = dict(cell=cell_name(record), **{key: record.get(key) for key in keys})
    row.update(block_size=record.get("block_size"), steps=record.get("steps"), error=record.get("error"))
    row.update(
        grad_accum=record.get("grad_accum") or 1,
        gradient_checkpointing=bool(record.get("gradient_checkpointing")),
    )
    row.update(
        tokens_per_s=record.get("tokens_per_s"),
        device=record.get("device"),
        ds_config=record.get("ds_config"),
        lora=record.get("lora"),
    )
    return row


def our_model(record: dict, lookup: FactsLookup, rank: int | None = None) -> PeakModel | None:
    """Our model of the record's engine (zero_train.memory.model.peak.engine_peak), None without model facts.

    Args:
        record: the run record.
        lookup: its model's facts.
        rank: the rank to model (None: the rank our model gives the highest peak).
    """
    if lookup.facts is None or modelled_engine(record["engine"]) is None:
        return None
    return engine_peak(
        record["engine"],
        lookup.facts.shape,
        record["world_size"],
        precision=record["precision"],
        micro_batch_size=record["micro_batch_size"],
        block_size=record["block_size"],
        ds_config=record.get("ds_config"),
        backend=backend_for(record.get("device")),
        rank=rank,
        grad_accum=record.get("grad_accum") or 1,
        gradient_checkpointing=bool(record.get("gradient_checkpointing")),
        activation_count=activation_count(record, lookup),
    )


def activation_count(record: dict, lookup: FactsLookup):
    """One micro-batch's activations counted on the record's architecture (fake tensors: no memory), or None
    when the model's config is unknown (our model then uses GPT-2's formula)."""
    if lookup.facts is None or lookup.facts.config is None:
        return None

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[record["precision"]]
    return count_activations(
        lookup.facts.config,
        micro_batch_size=record["micro_batch_size"],
        block_size=record["block_size"],
        dtype=dtype,
        gradient_checkpointing=bool(record.get("gradient_checkpointing")),
        lora=lookup.facts.lora,
    )


def _model_states(record: dict, measured: int, ours: dict | None, largest_layer: int) -> dict:
    """Measured model-state bytes beside the paper's, DeepSpeed's estimator's and ours, with ratios."""
    num_params, world_size, stage = record["num_params"], record["world_size"], record["zero_stage"]
    trainable = (record.get("lora") or {}).get("adapter_params")  # LoRA: the paper's rules on a frozen base
    paper = theory.paper_bytes(
        num_params, world_size, stage, precision=record["precision"], trainable=trainable
    )
    deepspeed = (
        None
        if trainable
        else deepspeed_estimate(num_params, world_size, stage, largest_layer_params=largest_layer)
    )
    ours_states = None if ours is None else sum(ours[name] for name in MODEL_STATE_CATEGORIES)
    return dict(
        measured=measured,
        paper=paper,
        deepspeed=deepspeed,
        ours=ours_states,
        paper_ratio=ratio(paper, measured),
        deepspeed_ratio=ratio(deepspeed, measured),
        ours_ratio=ratio(ours_states, measured),
    )


def _phase_peaks(rank: dict, other: int, model: PeakModel | None) -> dict:
    """Per probe phase ("forward" = forward + backward, "step"): measured peak minus "other" beside ours
    (`model` describes the same rank)."""
    measured = {phase["name"]: phase["peak_bytes"] - other for phase in rank["phases"]}
    result = {}
    for name in ("forward", "step"):
        ours = None
        if model is not None:
            ours = max(total for phase, total in model.phase_bytes.items() if MEASURED_PHASE[phase] == name)
        result[name] = dict(measured=measured.get(name), ours=ours, ratio=ratio(ours, measured.get(name)))
    return result


def baseline_other(rank: dict) -> int:
    """The "other" a peak estimate is given: the probe's other between steps (the level at the end of the step
    minus the engine's categories then) when the record has it, else "other" at the step boundary."""
    between = rank.get("other_between_steps")
    return rank["categories"]["other"] if between is None else between


def _estimated_between_steps(rank: dict, same_rank: PeakModel | None) -> int | None:
    """For records without the probe's other_between_steps: the end-of-step level minus our model's states
    at rest (what the engine keeps for the next forward); None without a step phase or our model."""
    step = next((phase for phase in rank["phases"] if phase["name"] == "step"), None)
    if step is None or same_rank is None:
        return None
    return step["current_bytes"] - sum(same_rank.phases["forward"].get(name, 0) for name in STATE_CATEGORIES)


def _peak(
    rank: dict, ranks: list[dict], states: dict, model: PeakModel | None, same_rank: PeakModel | None
) -> dict:
    """Measured peak beside each estimate plus the measured baseline "other" (no estimator predicts it), and
    ours alone beside the largest measured peak minus that baseline over the ranks.

    Args:
        rank: the reported rank's row (the highest measured peak).
        ranks: every rank's row.
        states: the model-state comparison (paper, DeepSpeed).
        model: our model of the rank with the highest predicted peak (what must fit).
        same_rank: our model of the reported rank (the phase by phase comparison).
    """
    peak_bytes, other = rank["peak_bytes"], baseline_other(rank)

    def plus_other(estimate):
        return None if estimate is None else estimate + other

    ours = None if model is None else model.peak_bytes
    result = dict(measured=peak_bytes, other=other, other_share=ratio(other, peak_bytes))
    for name, estimate in (("paper", states["paper"]), ("deepspeed", states["deepspeed"]), ("ours", ours)):
        result[name] = plus_other(estimate)
        result[f"{name}_ratio"] = ratio(plus_other(estimate), peak_bytes)
    result["within_goal_with_other"] = None if model is None else abs(result["ours_ratio"] - 1) <= PEAK_GOAL
    phases = {phase["name"]: phase["peak_bytes"] for phase in rank["phases"]}
    without = max(r["peak_bytes"] - baseline_other(r) for r in ranks)
    measured_between = rank.get("other_between_steps")
    baseline = rank.get("baseline_bytes")
    with_baseline = None if ours is None or baseline is None else ours + baseline
    result.update(
        within_goal=None if model is None else abs(ratio(ours, without) - 1) <= PEAK_GOAL,
        baseline=baseline,
        other_beyond_baseline=None if baseline is None else other - baseline,
        ours_plus_baseline=with_baseline,
        ours_plus_baseline_ratio=ratio(with_baseline, peak_bytes),
    )
    result.update(
        other_source="between steps" if measured_between is not None else "at the step boundary",
        other_between_steps=measured_between
        if measured_between is not None
        else _estimated_between_steps(rank, same_rank),
        ours_without_other=ours,
        measured_without_other=without,
        ratio_without_other=ratio(ours, without),
        ours_phase=None if model is None else model.peak_phase,
        measured_phase=max(phases, key=phases.get) if phases else None,
        phases=_phase_peaks(rank, other, same_rank),
    )
    return result


def _bytes_per_param(categories: dict, allocator: int, peak: int, num_params: int) -> dict:
    per_param = {name: categories[name] / num_params for name in CATEGORIES}
    per_param.update(
        model_states=model_state_bytes(categories) / num_params,
        allocator=allocator / num_params,
        peak=peak / num_params,
    )
    return per_param


NEEDED_FOR_THEORY = (
    "engine",
    "zero_stage",
    "num_params",
    "precision",
    "world_size",
    "micro_batch_size",
    "block_size",
)


def _check_theory_fields(record: dict) -> None:
    missing = [key for key in NEEDED_FOR_THEORY if record.get(key) in (None, "")]
    if missing or not record["num_params"] > 0:
        raise UsageError(
            f"run record {cell_name(record)} lacks {', '.join(missing) or 'a positive num_params'}; "
            "regenerate it with `zero-train profile`"
        )


def compare_cell(record: dict, lookup: FactsLookup) -> dict:
    """The comparison row of one run record (a failed cell: its settings and error only).

    Args:
        record: a validated run record (zero_train.memory.record).
        lookup: the model facts for the record's model (zero_train.report.models.model_facts).

    Returns:
        The row (see the module docstring for its keys); byte counts are per rank.

    Raises:
        UsageError: a successful record lacks a field the theory needs (stage, parameters, ...).
    """
    row = _meta(record)
    if record.get("error") is not None:
        return row
    _check_theory_fields(record)
    rank = _rank_row(reported_rank(record))
    categories, num_params = rank["categories"], record["num_params"]
    model = our_model(record, lookup)
    same_rank = our_model(record, lookup, rank=rank["rank"])
    ours = None if same_rank is None else same_rank.boundary
    largest_layer = lookup.facts.shape.largest_layer_params if lookup.facts else 0
    states = _model_states(record, rank["model_state_bytes"], ours, largest_layer)
    footprint_measured = rank["allocator_bytes"] - categories["other"]
    row.update(
        reported_rank=rank["rank"],
        ranks=[_rank_row(r) for r in record["ranks"]],
        categories=categories,
        allocator_bytes=rank["allocator_bytes"],
        peak_bytes=rank["peak_bytes"],
        baseline_bytes=rank["baseline_bytes"],
        bytes_per_param=_bytes_per_param(categories, rank["allocator_bytes"], rank["peak_bytes"], num_params),
        model_states=states,
        ours_categories=ours,
        ours_peak=None if model is None else model.as_dict(),
        paper_categories=theory.paper_categories(
            num_params,
            record["world_size"],
            record["zero_stage"],
            precision=record["precision"],
            trainable=(record.get("lora") or {}).get("adapter_params"),
        ),
        footprint=dict(
            measured=footprint_measured,
            ours=None if ours is None else sum(ours.values()),
            ratio=None if ours is None else ratio(sum(ours.values()), footprint_measured),
        ),
        peak=_peak(rank, [_rank_row(r) for r in record["ranks"]], states, model, same_rank),
        comm=comm_comparison(record, rank["comm_bytes_per_step"]),
        cuda=rank["cuda"],
        notes=[] if lookup.facts else [f"our model: n/a, {lookup.problem}"],
    )
    return row
