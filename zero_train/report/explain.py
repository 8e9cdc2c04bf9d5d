"""The words of the report: every large gap between measured and theory explained from the categories.

Pure functions over comparison rows (zero_train.report.compare). Each sentence carries its numbers. A
known cause is named with the setting or code that produces it (and the bytes it predicts); whatever
no rule accounts for is called "unexplained", with its size. Gaps below GAP_FRACTION of the quantity
compared or below MIN_GAP_BYTES (zero_train.report.compare.is_large) are not worth a sentence.

Model states: measured vs the paper, by category. `ours` (zero_train.memory.model.peak, its categories at the
step boundary) encodes the known departures from the paper (DeepSpeed's fp32 master copy in fp32 runs,
ZeRO-1's partitioned gradients at the step boundary), so paper -> ours is explained by rule and
ours -> measured must be explained by the layout (whole-tensor sharding) or called unexplained. The peak
is explained phase by phase in zero_train.report.explain_peak.
"""

from __future__ import annotations

from zero_train.memory.model.peak import TERM_WORDS
from zero_train.memory.record import MODEL_STATE_CATEGORIES
from zero_train.registry import DEEPSPEED, find_engine
from zero_train.report import units
from zero_train.report.buffers import buffer_sentence
from zero_train.report.compare import is_large, whole_tensor_sharded
from zero_train.report.explain_peak import peak_sentences
from zero_train.report.explain_runtime import comm_sentences, other_sentences
from zero_train.report.models import ModelFacts


def _paper_to_ours(row: dict, category: str) -> str | None:
    """Why our model departs from the paper for `category` (a rule of zero_train.memory.model.peak_engines)."""
    engine, world_size = row["engine"], row["world_size"]
    ours = row["ours_categories"][category]
    spec = find_engine(engine)
    if spec is None:
        return None
    if spec.family == DEEPSPEED and category == "master_params" and row["precision"] == "fp32":
        return (
            f"DeepSpeed keeps an fp32 master partition even in an fp32 run ({units.mb(ours)} = 4 bytes/param "
            f"/ {units.ranks(world_size)}, stage_1_and_2.py / stage3.py clone the partition); the paper's pure-fp32 "
            "variant has no separate master copy"
        )
    if category in spec.kept_whole:  # torch-zero's fp32 masters
        return (
            f"our {engine} engine keeps the fp32 master copy of every parameter on every rank ({units.mb(ours)} "
            "= 4 bytes/param, zero_train.engines.torch_zero); ZeroRedundancyOptimizer shards only the Adam "
            "states over them, where the paper shards the masters too"
        )
    if category in spec.partitioned_early:  # DeepSpeed ZeRO-1's reduced gradients
        return (
            f"at the step boundary {spec.label} holds only its reduced gradient partition "
            f"({units.mb(ours)}, 1/{world_size}), like ZeRO-2; the paper counts ZeRO-1's gradients whole, "
            "which they are during backward (our model's end of backward)"
        )
    return None


def greedy_loads(numels: list[int], world_size: int) -> list[int]:
    """Elements each rank owns under torch's ZeroRedundancyOptimizer: whole tensors, sorted-greedy (largest
    first, to the least-loaded rank, lowest rank on ties)."""
    loads = [0] * world_size
    for numel in sorted(numels, reverse=True):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        loads[rank] += numel
    return loads


def _imbalance(row: dict, category: str, facts: ModelFacts | None, residual: float) -> str | None:
    """Whole-tensor sharding (torch-zero) explains a rank holding more (or less) than 1/N of the optimizer
    state; our ZeRO-1/2 cut equal slices, so they have no such gap."""
    if (
        not whole_tensor_sharded(row["engine"])
        or category not in ("optimizer_states", "master_params")
        or facts is None
    ):
        return None
    owned = greedy_loads(list(facts.param_numels), row["world_size"])[row["reported_rank"]]
    per_param = {"optimizer_states": 8, "master_params": 4}[category]  # Adam: two fp32 moments; fp32 masters
    predicted = owned * per_param
    measured = row["categories"][category]
    if is_large(measured - predicted, measured):
        return None
    return (
        f"whole-tensor sharding (sorted-greedy, largest tensor {max(facts.param_numels):,} params): rank "
        f"{row['reported_rank']} owns {owned:,} of {row['num_params']:,} parameters "
        f"({units.percent(owned / row['num_params'])} instead of 1/{row['world_size']}), so {owned:,} x "
        f"{per_param} bytes = {units.mb(predicted)} ({units.mb(residual)} above the even share)"
    )


def model_state_sentences(row: dict, facts: ModelFacts | None) -> list[str]:
    """Measured model states vs the paper, category by category, with the cause of every large gap."""
    states = row["model_states"]
    sentences = []
    for category in MODEL_STATE_CATEGORIES:
        measured, paper = row["categories"][category], row["paper_categories"][category]
        if not is_large(measured - paper, states["measured"]):
            continue
        causes, residual = [], measured - paper
        if row["ours_categories"] is not None:
            known = _paper_to_ours(row, category)
            if known:
                causes.append(known)
                residual = measured - row["ours_categories"][category]
        if is_large(residual, states["measured"]):
            layout = _imbalance(row, category, facts, residual)
            causes.append(layout or f"unexplained: {units.mb(residual)}")
        word = TERM_WORDS[category]
        sentences.append(
            f"{word}: measured {units.mb(measured)}, the paper {units.mb(paper)} "
            f"({units.mb(measured - paper)} apart): " + "; ".join(causes) + "."
        )
    return sentences + _estimator_sentences(row, facts)


def _estimator_sentences(row: dict, facts: ModelFacts | None) -> list[str]:
    """What DeepSpeed's estimator assumes, when its answer is far from the measured model states."""
    states, stage, world_size = row["model_states"], row["zero_stage"], row["world_size"]
    if states["deepspeed"] is None or not is_large(
        states["deepspeed"] - states["measured"], states["measured"]
    ):
        return []
    if stage == 2:
        formula = f"2 + 18/{world_size} bytes/param"
    else:
        largest = facts.shape.largest_layer_params if facts else 0
        formula = (
            f"18/{world_size} bytes/param plus 4 bytes for each of the largest layer's {largest:,} params"
        )
    precision_note = (
        " (mixed-precision constants, whatever the run's precision)" if row["precision"] == "fp32" else ""
    )
    return [
        f"DeepSpeed's estimator: {units.mb(states['deepspeed'])} = {formula}{precision_note}, "
        f"{units.ratio_text(states['deepspeed_ratio'])} x the measured {units.mb(states['measured'])}."
    ]


def buffer_sentences(row: dict, facts: ModelFacts | None) -> list[str]:
    """comm_buffers: what each engine keeps for communication, predicted from its settings."""
    measured = row["categories"]["comm_buffers"]
    ours = None if row["ours_categories"] is None else row["ours_categories"]["comm_buffers"]
    footprint = row["footprint"]["measured"]
    if not is_large(measured, footprint) and (ours is None or not is_large(ours, footprint)):
        return []
    return [buffer_sentence(row, facts, measured, ours, footprint)]


def activation_sentences(row: dict) -> list[str]:
    """Activations saved for backward vs our formula (only when they disagree)."""
    measured = row["categories"]["activations"]
    if row["ours_categories"] is None:
        return []
    ours = row["ours_categories"]["activations"]
    if not is_large(measured - ours, max(measured, 1)):
        return []
    return [
        f"activations: measured {units.mb(measured)} (saved for backward, micro-batch "
        f"{row['micro_batch_size']} x block {row['block_size']}), our formula {units.mb(ours)} "
        f"({units.ratio_text(ours / measured if measured else None)} x): unexplained {units.mb(measured - ours)}."
    ]


def explain_cell(row: dict, facts: ModelFacts | None, reference: dict | None) -> list[str]:
    """Every sentence for one successful cell.

    Args:
        row: the cell's comparison row.
        facts: its model's facts (None: layout-based causes are not computed).
        reference: the ddp row of the same model, precision and world size, if measured ("other" is
            compared with it).

    Returns:
        Sentences, model states first, then buffers, activations, "other", the peak, communication.
    """
    return [
        *model_state_sentences(row, facts),
        *buffer_sentences(row, facts),
        *activation_sentences(row),
        *other_sentences(row, reference),
        *peak_sentences(row),
        *comm_sentences(row, facts),
    ]
