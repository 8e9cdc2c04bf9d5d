"""Sentences about what no model-state formula covers: "other" and communication per step.

Pure functions over comparison rows (zero_train.report.compare); see zero_train.report.explain (the peak's
sentences are in zero_train.report.explain_peak).
"""

from __future__ import annotations

from zero_train.memory.model.host_build import builds_under_zero_init
from zero_train.memory.model.peak import backend_for
from zero_train.registry import DEEPSPEED, REFERENCE, find_engine
from zero_train.report import units
from zero_train.report.compare import is_large
from zero_train.report.models import ModelFacts
from zero_train.report.traffic import element_bytes
from zero_train.sharding import accounting

DEEPSPEED_FIRST_INIT_BYTES = 16_000_000
"""Library state the first `deepspeed.initialize` of a process allocates beyond the tensors it creates,
measured on `tiny` and `gpt2-25m` (docs/memory_model.md#deepspeeds-first-initialize)."""
# The phase whose end level is where a phase starts (forward follows the previous step).
PHASE_STARTS = {"forward": ("step", "engine_initialized"), "step": ("forward",), "engine_initialized": ()}


def phase_record(row: dict, name: str) -> dict | None:
    """The reported rank's record of phase `name` (current_bytes at its end, peak_bytes inside), if any."""
    rank = next(r for r in row["ranks"] if r["rank"] == row["reported_rank"])
    return next((p for p in rank["phases"] if p["name"] == name), None)


def _unattributed(row: dict) -> int:
    return row["categories"]["other"] - (row["baseline_bytes"] or 0)


def other_sentences(row: dict, reference: dict | None) -> list[str]:
    """Where "other" comes from: the baseline before the model, then growth no engine tensor owns."""
    other, baseline = row["categories"]["other"], row["baseline_bytes"] or 0
    sentences = [
        f"other = {units.mb(other)} ({units.percent(other / row['allocator_bytes'])} of the training "
        f"footprint), owned by no engine tensor: {units.mb(baseline)} was in use before the model existed "
        "(the probe's baseline: the interpreter, torch, transformers, DeepSpeed, the tokenizer and the "
        f"tokenized dataset); {units.mb(other - baseline)} appeared later (library state created while "
        "building the model and the engine, allocator chunk headers)."
    ]
    if reference is None or reference is row:
        return sentences
    extra = _unattributed(row) - _unattributed(reference)
    if not is_large(extra, row["allocator_bytes"]) or abs(extra) < 1e6:
        return sentences
    sentence = (
        f"{row['engine']} leaves {units.mb(extra)} more in other than {REFERENCE} at "
        f"{units.ranks(row['world_size'])}"
    )
    spec = find_engine(row["engine"])
    if spec is not None and spec.family == DEEPSPEED and extra > 0:
        explained = min(extra, DEEPSPEED_FIRST_INIT_BYTES)
        sentence += (
            f": about {units.mb(explained)} is the library state of the first deepspeed.initialize in a "
            "process (measured separately: about 570 modules imported and the shared-memory comm op loaded, "
            "0.1-0.8 MB on a second call)"
        )
        extra -= explained
    if abs(extra) < 1e6:
        return sentences + [sentence + "."]
    sentence += f"; unexplained: {units.mb(extra)}"
    built, reference_built = phase_record(row, "model_built"), phase_record(reference, "model_built")
    if built and reference_built and not (spec and builds_under_zero_init(spec)):  # already partitioned
        before = built["current_bytes"] - reference_built["current_bytes"]
        sentence += (
            f" ({units.mb(before)} of the difference was there after building the model, before the engine)"
        )
    return sentences + [sentence + "."]


def phase_rise(row: dict, name: str) -> int | None:
    """How far the reported rank's level rose inside phase `name` above the level it started from."""
    phase = phase_record(row, name)
    for previous in PHASE_STARTS.get(name, ()):
        start = phase_record(row, previous)
        if phase is not None and start is not None:
            return phase["peak_bytes"] - start["current_bytes"]
    return None


def _comm_cause(row: dict, facts: ModelFacts | None, psi: dict[str, float]) -> str | None:
    engine, world_size = row["engine"], row["world_size"]
    spec = find_engine(engine)
    ours = spec is not None and spec.ours
    zero = (row.get("ds_config") or {}).get("zero_optimization", {})
    if engine == REFERENCE:
        return "DDP all-reduces every gradient bucket: the paper's 2 Psi"
    if spec is not None and spec.sharding == "whole-tensor":  # torch-zero
        masters = " (its fp32 master copies: 4 bytes each)" if row["precision"] != "fp32" else ""
        return (
            "ZeroRedundancyOptimizer wraps DDP: gradients are all-reduced whole (2 Psi, not reduce-scattered), "
            f"then every owner broadcasts its updated parameters{masters}: {psi.get('broadcast', 0):.2f} Psi"
        )
    if ours and world_size == 1:
        return f"our ZeRO-{spec.stage} skips every collective on 1 rank"
    if ours and spec.stage in GRADIENT_RINGS and facts is not None:
        return _zero1_comm_cause(row, facts)
    if (
        spec is not None
        and spec.family == DEEPSPEED
        and spec.stage in (1, 2)
        and psi.get("all_reduce")
        and zero.get("use_multi_rank_bucket_allreduce", True)
    ):
        gather = ", plus the all-gather of the updated parameters (1 Psi)" if psi.get("all_gather") else ""
        return (
            "DeepSpeed 0.19's ZeRO-1/2 all-reduces its gradient buckets (zero_optimization."
            "use_multi_rank_bucket_allreduce, default true) instead of reduce-scattering them: 2 Psi instead of "
            f"1{gather}"
        )
    if spec is not None and builds_under_zero_init(spec) and 0 < psi.get("all_gather", 0) < 1.5:
        live = int(zero.get("stage3_max_live_parameters", 1e9))
        return (
            f"the paper counts 3 Psi for ZeRO-3 (parameters all-gathered in forward and again in backward); "
            f"here {psi['all_gather']:.2f} Psi of all-gather: parameters gathered in forward stayed live through "
            f"backward (stage3_max_live_parameters = {live:,} >= {row['num_params']:,})"
        )
    return None


GRADIENT_RINGS = {
    1: "each bucket to its owners during the last backward",
    2: "each bucket to its owners during every backward",
}
"""How our ZeRO-1 and ZeRO-2 (by stage) send the gradients to their owners (the sharders' accounting
describes these two)."""


def _zero1_comm_cause(row: dict, facts: ModelFacts) -> str:
    """Our ZeRO-1's (and ZeRO-2's: its bucket reductions send what ZeRO-1's reduce-scatter does) bytes from
    the sharders' own accounting (zero_train.sharding.accounting), per backend."""
    world_size, backend = row["world_size"], backend_for(row.get("device"))
    stage = find_engine(row["engine"]).stage
    partition = accounting.partition_of(facts.param_numels, world_size)
    sent = accounting.comm_bytes_per_step(partition, row["reported_rank"], 1, backend)
    rings = (sent["reduce"] + sent["all_gather"]) / row["num_params"]
    if backend != "gloo":
        return (
            f"our ZeRO-{stage} reduces the gradients ({GRADIENT_RINGS[stage]}) and all-gathers "
            f"the parameters with torch's collectives over {world_size} equal slices: {rings:.2f} Psi sent"
        )
    return (
        f"our ZeRO-{stage} runs point-to-point rings on gloo ({GRADIENT_RINGS[stage]}, then an "
        "all-gather) that send every slice's "
        f"data but one and never the padding: rank {row['reported_rank']} sends {rings:.2f} Psi, which the "
        f"ledger counts on both ends ({2 * rings:.2f} Psi)"
    )


def comm_sentences(row: dict, facts: ModelFacts | None) -> list[str]:
    """Communication per step in Psi units, the paper's volume, and why they differ."""
    comm = row["comm"]
    if comm["payload"] is None:
        return ["communication: not measured (no CommLedger in this run)."]
    psi = {key: value / comm["psi_bytes"] for key, value in comm["volume"].items()}
    terms = " + ".join(f"{key} {value:.2f}" for key, value in psi.items() if value >= 0.005) or "nothing"
    paper_psi = comm["paper_volume"] / comm["psi_bytes"]
    sentence = (
        f"communication per step: {terms} = {comm['measured_volume'] / comm['psi_bytes']:.2f} Psi in the "
        f"paper's unit (Psi = {row['num_params']:,} x {element_bytes(row['precision'])} bytes), the paper "
        f"{paper_psi:.0f} Psi: {units.ratio_text(comm['ratio'])} x"
    )
    cause = _comm_cause(row, facts, psi)
    sentence += f"; {cause}" if cause else ""
    if row["world_size"] == 1 and comm["measured_volume"]:
        sentence += "; with 1 rank the collectives run but move nothing over a wire"
    if comm["gloo_emulated_reduce_scatter"] and row["world_size"] > 1:
        sentence += (
            "; on gloo, reduce_scatter is emulated inside the backend as an all-reduce plus a copy, so the wire "
            f"carries about twice the {psi['reduce_scatter']:.2f} Psi counted for it"
        )
    return [sentence + "."]
