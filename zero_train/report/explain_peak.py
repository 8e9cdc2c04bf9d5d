"""The peak in words: where the measured peak happened, what our phase model holds then, and every gap.

Pure functions over comparison rows (zero_train.report.compare): row["ours_peak"] is our model
(zero_train.memory.model.peak.PeakModel.as_dict()), row["peak"] its comparison with the measured peak. The probe
measures forward and backward as one phase (its "forward") and the step as another, so each of our phases
is compared with the probe phase it falls in. A gap is named with its size; "other" at the step boundary
that is gone between steps (a transient no category owns) is told apart from what our model misses.
"""

from __future__ import annotations

from zero_train.memory.model.peak import TERM_WORDS
from zero_train.registry import find_engine
from zero_train.report import units
from zero_train.report.compare import PEAK_GOAL, is_large, whole_tensor_sharded
from zero_train.report.explain_runtime import phase_rise

PROBE_PHASE_WORDS = {"forward": "forward+backward", "step": "optimizer step"}
OUR_PHASE_WORDS = {
    "forward": "the end of forward",
    "backward_start": "the start of backward",
    "backward_end": "the end of backward",
    "step": "the optimizer step",
}


def _terms(terms: dict[str, int]) -> str:
    return " + ".join(f"{TERM_WORDS.get(name, name)} {units.mb(value)}" for name, value in terms.items())


def _measured_sentence(row: dict) -> str:
    """Where the reported rank's peak was, and how far above the level its phase started from."""
    rank = next(r for r in row["ranks"] if r["rank"] == row["reported_rank"])
    if not rank["phases"]:
        return f"peak {units.mb(row['peak_bytes'])}: no phases recorded, so where it happened is unknown."
    phase = max(rank["phases"], key=lambda p: p["peak_bytes"])["name"]
    rise = phase_rise(row, phase)
    sentence = f"peak {units.mb(row['peak_bytes'])} in the {PROBE_PHASE_WORDS.get(phase, phase)} phase" + (
        "" if rise is None else f", {units.mb(rise)} above the level that phase started from"
    )
    footprint = row["allocator_bytes"]
    if row["peak_bytes"] < footprint:
        sentence += (
            f"; below the footprint ({units.mb(footprint)} = step-boundary level + "
            f"{units.mb(row['categories']['activations'])} of activations): whole gradients and all activations "
            "never coexist (backward frees activations as gradients appear), so a footprint overstates the peak"
        )
    return sentence + "."


def _ours_sentence(row: dict) -> str:
    """Our model's peak phase with its terms, plus the measured other, against the measured peak."""
    ours, peak = row["ours_peak"], row["peak"]
    phase = ours["peak_phase"]
    verdict = "within" if peak["within_goal"] else "OUTSIDE"
    whole_tensors = whole_tensor_sharded(row["engine"])
    whose = (
        ""
        if ours["rank"] == row["reported_rank"] or not whole_tensors
        else (f" (for rank {ours['rank']}, which whole-tensor sharding gives the highest peak)")
    )
    baseline = peak.get("baseline")
    baseline_words = (
        ""
        if baseline is None
        else (
            f"; {units.mb(baseline)} of it was there before the model was built (ours + that: "
            f"{units.ratio_text(peak.get('ours_plus_baseline_ratio'))} x the whole peak)"
        )
    )
    return (
        f"our model{whose} peaks at {OUR_PHASE_WORDS[phase]}: {units.mb(ours['peak_bytes'])} = "
        f"{_terms(ours['phases'][phase])}; against the measured peak minus other, {units.mb(peak['ours_without_other'])} "
        f"vs {units.mb(peak['measured_without_other'])} (the largest over the ranks): "
        f"{units.ratio_text(peak['ratio_without_other'])} x, {verdict} the {PEAK_GOAL:.0%} goal. The measured other "
        f"{units.mb(peak['other'])} ({peak['other_source']}; no estimator predicts it){baseline_words}; with it "
        f"added, as reported before, {units.mb(peak['ours'])}, {units.ratio_text(peak['ours_ratio'])} x the peak."
    )


def other_drift(row: dict) -> int | None:
    """How much more "other" the reported rank held at the step boundary (when the probe attributes) than
    between steps (measured by the probe, or for older records estimated: zero_train.report.compare)."""
    between = row["peak"].get("other_between_steps")
    return None if between is None else row["categories"]["other"] - between


def _drift_sentence(row: dict) -> str | None:
    """A sentence when "other" held a transient at the step boundary that is gone between steps."""
    drift, peak = other_drift(row), row["peak"]
    if drift is None or not is_large(drift, peak["measured_without_other"]):
        return None
    sentence = (
        f"the reported rank's other was {units.mb(drift)} higher at the step boundary, when the probe attributes, "
        f"than between steps ({units.mb(peak['other_between_steps'])}): a transient no category owns"
    )
    if peak["other_source"] == "between steps":
        return sentence + "; the peak comparison uses the level between steps, measured by the probe."
    return sentence + (
        " (between steps estimated as the end-of-step level minus our model's states at rest: this record "
        "predates the probe's other_between_steps), so every measured number minus other here is low by "
        "about that much."
    )


def _drift_in_baseline(row: dict) -> int:
    """The part of a phase gap due to a step-boundary transient still inside the baseline "other"."""
    if row["peak"]["other_source"] == "between steps" or _drift_sentence(row) is None:
        return 0
    return other_drift(row) or 0


def _residual_words(row: dict, phase: str, residual: int) -> str:
    """A large gap in one phase: a known cause with its size where there is one, else "unexplained"."""
    words = f", {'over' if residual > 0 else 'under'} by {units.mb(residual)}"
    last_rank = row["world_size"] - 1
    spec = find_engine(row["engine"])
    late = spec is not None and spec.grads_at_first_reduction
    if late and phase == "forward" and residual > 0 and row["reported_rank"] != last_rank:
        partition = row["ours_categories"]["grads"]
        return words + (
            f": {spec.label} allocates a rank's gradient partition ({units.mb(partition)}) at its first "
            f"reduction; our model allocates it at the start of backward, beside every activation, which holds "
            f"for rank {last_rank} (its parameters get their gradients first); rank {row['reported_rank']}'s "
            "comes later, when activations are partly freed"
        )
    return words + ", unexplained"


def _phases_sentence(row: dict) -> str:
    """Each probe phase: ours vs the measured phase peak minus other, and every large gap left unexplained."""
    drift = _drift_in_baseline(row)
    parts = []
    for name, phase in row["peak"]["phases"].items():
        if phase["measured"] is None or phase["ours"] is None:
            continue
        part = (
            f"{PROBE_PHASE_WORDS.get(name, name)} ours {units.mb(phase['ours'])} vs {units.mb(phase['measured'])} "
            f"({units.ratio_text(phase['ratio'])} x)"
        )
        residual = phase["ours"] - phase["measured"] - drift
        if is_large(residual, phase["measured"]):
            part += _residual_words(row, name, residual)
        parts.append(part)
    return "by phase, ours vs the measured phase peak minus other: " + "; ".join(parts) + "."


def peak_sentences(row: dict) -> list[str]:
    """Where the peak happened, what our model holds then, and how each phase compares."""
    sentences = [_measured_sentence(row)]
    if row["ours_peak"] is not None:
        drift = _drift_sentence(row)
        sentences += [_ours_sentence(row), *([drift] if drift else []), _phases_sentence(row)]
    return sentences
