"""The out-of-sample memory matrix: which cells to run, and what their comparison rows say together.

Our peak model (zero_train.memory.model.peak) was derived from the engines' code and checked on gpt2-25m
(12 x 384, micro-batch 2 x block 64, one micro-batch per step, no checkpointing). This matrix runs cells it
was NOT fitted on: three architectures built from small configs (GPT-2, Llama with an untied head, Qwen2
with q/k/v biases and one KV head), activation checkpointing on and off, accumulation 1 and 4, world sizes
2 and 3, fp32 and bf16, for every engine. Not the full product (3 x 2^4 x 6 = 288 runs): each engine gets
the 8 cells of a 2^(4-1) half fraction of the four two-level factors (every level of every factor meets
every engine 4 times, every pair of levels twice), the two halves alternating between engines so that all
16 combinations appear over the matrix, and the architecture rotating so that each meets each engine 2-3
times. 48 cells, then 8 offload cells, then 8 per engine added since (our ZeRO-3), then 12 LoRA cells
(each the twin of a full fine-tuning cell), appended so that the cells measured before keep their names. scripts/memory_matrix.py runs them; docs/memory_matrix.md has the
figures.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from dataclasses import dataclass

from zero_train.registry import ENGINES

MATRIX_ENGINES = tuple(spec.name for spec in ENGINES if spec.matrix)
"""The design's six engines (zero_train.registry: `matrix`)."""
ADDED_ENGINES = tuple(spec.name for spec in ENGINES if spec.matrix_added)
"""Engines added to the matrix after its design (registry: `matrix_added`), each with its own 8 cells."""
OFFLOAD_ENGINES = ("ds2-offload", "ds3-offload")
"""DeepSpeed ZeRO-2 with offload_optimizer cpu, ZeRO-3 with offload_optimizer and offload_param cpu."""
OFFLOAD_SUFFIX = "-offload"
MICRO_BATCH_SIZE = 2
BLOCK_SIZE = 128
# A table of transformers config fields per shape: entries of one model type share a shape, not logic.
ARCHITECTURES: dict[str, dict] = {
    "gpt2": dict(
        model_type="gpt2",
        n_layer=4,
        n_embd=256,
        n_head=4,
        n_positions=256,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    ),
    "llama": dict(
        model_type="llama",
        num_hidden_layers=4,
        hidden_size=256,
        intermediate_size=704,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    ),
    "qwen2": dict(
        model_type="qwen2",
        num_hidden_layers=3,
        hidden_size=320,
        intermediate_size=896,
        num_attention_heads=5,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    ),
    "gpt2-3x192": dict(
        model_type="gpt2",
        n_layer=3,
        n_embd=192,
        n_head=6,
        n_positions=256,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    ),
    "qwen2-3x192": dict(
        model_type="qwen2",
        num_hidden_layers=3,
        hidden_size=192,
        intermediate_size=544,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    ),
    "qwen2.5-0.5b-shape": dict(
        model_type="qwen2",
        num_hidden_layers=24,
        hidden_size=896,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    ),
}
"""Small shapes of three architectures (vocabulary: the offline tokenizer's 8192): 5.3M, 7.2M, 6.0M
parameters; none is the shape the model was checked on. The wide design's (`wide_design`) are two more shapes
no earlier cell used, GPT-2 (tied, 3 x 192) and Qwen2 (biases, GQA 6/2, untied, 3 x 192), and Qwen2.5-0.5B's
published shape with the offline vocabulary (0.36B parameters)."""
COMPACT_ARCHITECTURES = ("gpt2", "llama", "qwen2")
"""The compact design's three (`design`)."""


@dataclass(frozen=True)
class MatrixCell:
    """One run of the matrix."""

    architecture: str
    engine: str
    world_size: int
    precision: str
    grad_accum: int = 1
    gradient_checkpointing: bool = False
    lora_r: int = 0
    """LoRA adapters of this rank (peft's default targets for the architecture) on a frozen base; 0: full."""

    @property
    def name(self) -> str:
        """e.g. `llama-ds2-w3-bf16-ga4-ckpt`, `gpt2-ddp-w2-fp32-lora8`."""
        return (
            f"{self.architecture}-{self.engine}-w{self.world_size}-{self.precision}"
            + (f"-ga{self.grad_accum}" if self.grad_accum > 1 else "")
            + ("-ckpt" if self.gradient_checkpointing else "")
            + (f"-lora{self.lora_r}" if self.lora_r else "")
        )

    @property
    def full_twin(self) -> str:
        """The name of the full fine-tuning cell with the same factors (its own name without LoRA)."""
        return dataclasses.replace(self, lora_r=0).name


def design() -> list[MatrixCell]:
    """The 76 cells: per engine a 2^(4-1) half fraction of (checkpointing, accumulation, world size,
    precision), the defining relation alternating by engine, the architecture rotating (48); then the 8
    offload cells (`offload_design`); then the added engines' cells, continuing the alternation (8 each);
    then the 12 LoRA cells (`lora_design`)."""
    engines = (*MATRIX_ENGINES, *ADDED_ENGINES)
    cells = [cell for index, engine in enumerate(MATRIX_ENGINES) for cell in _half_fraction(engine, index)]
    added = [
        cell
        for index, engine in enumerate(engines)
        if engine in ADDED_ENGINES
        for cell in _half_fraction(engine, index)
    ]
    return cells + offload_design() + added + lora_design(cells)


def _half_fraction(engine: str, engine_index: int) -> list[MatrixCell]:
    """The engine's 8 cells: the combinations of the four two-level factors whose sum has the engine index's
    parity, the architecture rotating with the cell and engine index."""
    architectures = list(COMPACT_ARCHITECTURES)
    combos = [c for c in itertools.product((0, 1), repeat=4) if sum(c) % 2 == engine_index % 2]
    return [
        _two_level_cell(
            architectures[(cell_index + engine_index) % len(architectures)],
            engine,
            ckpt=ckpt,
            accum=accum,
            world=world,
            precision=precision,
        )
        for cell_index, (ckpt, accum, world, precision) in enumerate(combos)
    ]


def _two_level_cell(
    architecture: str, engine: str, *, ckpt: int, accum: int, world: int, precision: int
) -> MatrixCell:
    """The cell at these levels (0 or 1) of the fractional designs' four two-level factors: checkpointing
    off/on, accumulation 1/4, world size 2/3, fp32/bf16."""
    return MatrixCell(
        architecture=architecture,
        engine=engine,
        world_size=(2, 3)[world],
        precision=("fp32", "bf16")[precision],
        grad_accum=(1, 4)[accum],
        gradient_checkpointing=bool(ckpt),
    )


LORA_R = 8
"""The LoRA cells' adapter rank (peft's default targets: GPT-2's c_attn, Llama's and Qwen2's q_proj, v_proj)."""


def lora_design(full: list[MatrixCell]) -> list[MatrixCell]:
    """The 12 LoRA cells: for each engine the first and the last of its 8 full cells (one without
    checkpointing or accumulation, one with both; one fp32, one bf16; both world sizes), with LoRA r
    LORA_R: every LoRA cell has a full fine-tuning twin in the matrix."""
    cells = []
    for engine in MATRIX_ENGINES:
        mine = [cell for cell in full if cell.engine == engine]
        cells += [dataclasses.replace(cell, lora_r=LORA_R) for cell in (mine[0], mine[-1])]
    return cells


def base_engine(engine: str) -> str:
    """The engine our peak model knows a matrix engine by ("ds2-offload" -> "ds2"; the offload is in the
    cell's DeepSpeed config)."""
    return engine.removesuffix(OFFLOAD_SUFFIX)


def offload_design() -> list[MatrixCell]:
    """The 8 offload cells: per offload engine a 2^(3-1) half fraction of (checkpointing, accumulation,
    precision), the two engines on opposite halves (so all 8 combinations appear), world size 2 and 3 and
    the architecture (gpt2, llama) alternating."""
    cells = []
    for engine_index, engine in enumerate(OFFLOAD_ENGINES):
        combos = [c for c in itertools.product((0, 1), repeat=3) if sum(c) % 2 == engine_index % 2]
        for cell_index, (ckpt, accum, precision) in enumerate(combos):
            architecture = ("gpt2", "llama")[(cell_index + engine_index) % 2]
            cells.append(
                _two_level_cell(
                    architecture, engine, ckpt=ckpt, accum=accum, world=cell_index // 2, precision=precision
                )
            )
    return cells


WIDE_ARCHITECTURES = ("gpt2-3x192", "qwen2-3x192")
WIDE_VARIANTS = ("plain", "ckpt", "ga4", "lora8")
"""Each wide cell is one of: nothing added, activation checkpointing, accumulation 4, LoRA r 8 (full otherwise)."""
LARGE_ARCHITECTURE = "qwen2.5-0.5b-shape"
LARGE_ENGINES = tuple(
    spec.name
    for spec in sorted((spec for spec in ENGINES if spec.matrix_large), key=lambda spec: not spec.ours)
)
"""The engines of the 0.36B cells (the registry's matrix_large), ours first: the design's order."""
_OURS_SHARDING_GRADIENTS = tuple(spec.name for spec in ENGINES if spec.ours and spec.stage >= 2)
"""Our ZeRO-2 and ZeRO-3, whose bf16 cells the wide design puts last."""


def wide_design() -> list[MatrixCell]:
    """The full product, no fraction: every engine of the registry with a peak model x fp32/bf16 x 1/2/4
    ranks x WIDE_VARIANTS on both WIDE_ARCHITECTURES (480 cells), then the 0.36B cells (LARGE_ENGINES at 2
    ranks, fp32, plain: 5). bf16 cells of our ZeRO-2/3 come last (their bf16 gradient accumulation dtype was
    being changed when the design was written; it is fp32 since, and every such cell was measured after)."""
    engines = [spec.name for spec in ENGINES if spec.peak_model]
    variants = dict(
        plain={}, ckpt=dict(gradient_checkpointing=True), ga4=dict(grad_accum=4), lora8=dict(lora_r=LORA_R)
    )
    cells = [
        MatrixCell(
            architecture=arch, engine=engine, world_size=world_size, precision=precision, **variants[variant]
        )
        for arch in WIDE_ARCHITECTURES
        for precision in ("fp32", "bf16")
        for world_size in (1, 2, 4)
        for engine in engines
        for variant in WIDE_VARIANTS
    ]
    late = [c for c in cells if c.precision == "bf16" and c.engine in _OURS_SHARDING_GRADIENTS]
    large = [
        MatrixCell(architecture=LARGE_ARCHITECTURE, engine=engine, world_size=2, precision="fp32")
        for engine in LARGE_ENGINES
    ]
    return [c for c in cells if c not in late] + large + late


STATE_AND_ACTIVATION = ("params", "grads", "master_params", "optimizer_states", "comm_buffers", "activations")


def missing_term(row: dict) -> str:
    """The term of our model that misses in a comparison row, in words with its bytes: the category at the step
    boundary whose measured and predicted bytes differ most, when that difference is at least half the peak's
    gap; else the measured peak phase's largest term that is not a model state (what the probe cannot split)."""
    peak = row["peak"]
    gap = peak["measured_without_other"] - peak["ours_without_other"]
    measured, ours = row["categories"], row["ours_categories"] or {}
    diffs = {name: measured.get(name, 0) - ours.get(name, 0) for name in STATE_AND_ACTIVATION}
    name = max(diffs, key=lambda key: abs(diffs[key]))
    if gap and abs(diffs[name]) >= abs(gap) / 2:
        return (
            f"{name}: ours {ours.get(name, 0) / 1e6:.1f} MB, measured {measured.get(name, 0) / 1e6:.1f} MB "
            f"at the step boundary"
        )
    phase = "step" if peak["measured_phase"] == "step" else peak["ours_phase"]
    terms = row["ours_peak"]["phases"].get(phase, {})
    transient = {key: value for key, value in terms.items() if key not in STATE_AND_ACTIVATION} or terms
    largest = max(transient, key=lambda key: transient[key]) if transient else "none"
    side = "above" if gap > 0 else "below"
    return (
        f"measured {peak['measured_phase']} peak {abs(gap) / 1e6:.1f} MB {side} ours ({peak['ours_phase']}), "
        f"whose largest transient term is {largest} ({transient.get(largest, 0) / 1e6:.1f} MB)"
    )


def distribution(values: list[float]) -> dict:
    """min / median / max of `values` (None for each if empty)."""
    if not values:
        return dict(min=None, median=None, max=None)
    return dict(min=min(values), median=statistics.median(values), max=max(values))


def summarize(rows: list[dict], goal: float) -> dict:
    """The matrix's figures from its comparison rows (zero_train.report.compare.compare_cell, each with
    "matrix_cell"): the headline ratio ours / (peak - other) and its distribution, the old figure with the
    measured other, and the cells outside `goal`.

    Returns:
        {"cells", "failed", "within", "ratio" (distribution), "ratio_with_other", "ratio_with_baseline",
         "misses": [row names], "by_factor": {factor: {level: distribution}}}
    """
    done = [row for row in rows if not row.get("error") and row.get("peak", {}).get("ratio_without_other")]
    ratios = [row["peak"]["ratio_without_other"] for row in done]
    misses = [row["matrix_cell"] for row in done if abs(row["peak"]["ratio_without_other"] - 1) > goal]
    by_factor: dict[str, dict] = {}
    for factor in (
        "architecture",
        "engine",
        "world_size",
        "precision",
        "grad_accum",
        "gradient_checkpointing",
        "lora_r",
    ):
        levels: dict[str, list[float]] = {}
        for row in done:
            levels.setdefault(str(row["matrix"][factor]), []).append(row["peak"]["ratio_without_other"])
        by_factor[factor] = {level: distribution(values) for level, values in levels.items()}
    return dict(
        cells=len(rows),
        failed=[row["matrix_cell"] for row in rows if row.get("error")],
        within=len(done) - len(misses),
        ratio=distribution(ratios),
        ratio_with_other=distribution([row["peak"]["ours_ratio"] for row in done]),
        ratio_with_baseline=distribution(
            [
                row["peak"]["ours_plus_baseline_ratio"]
                for row in done
                if row["peak"].get("ours_plus_baseline_ratio")
            ]
        ),
        misses=misses,
        by_factor=by_factor,
    )
