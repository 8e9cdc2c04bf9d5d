"""The memory matrix's LoRA cells beside their full fine-tuning twins: peaks and what LoRA saves, by category.

Every LoRA cell of the design (zero_train.report.matrix.lora_design) has a full fine-tuning twin with the
same factors. Our model of the twin comes from the same record (`full_twin_model`); the twin's measured peak
from the same matrix run when it was run, else from a reference matrix (e.g. docs/report/matrix.json).
"""

from __future__ import annotations

from zero_train.report.compare import our_model, reported_rank
from zero_train.report.markdown import table
from zero_train.report.models import model_facts

CATEGORIES = ("params", "grads", "master_params", "optimizer_states", "comm_buffers", "activations")


def full_twin_model(record: dict) -> dict | None:
    """Our model of the record's run without LoRA (same engine, model, batch, precision): {"peak_bytes",
    "categories"} of the rank the record reports, None when the model cannot be rebuilt."""

    full = dict(record, lora=None)
    lookup = model_facts(record.get("model"), None)
    rank = reported_rank(record)["rank"]
    model, same_rank = our_model(full, lookup), our_model(full, lookup, rank=rank)
    if model is None or same_rank is None:
        return None
    return dict(peak_bytes=model.peak_bytes, categories=same_rank.boundary)


def _mb(value) -> str:
    return "n/a" if value is None else f"{value / 1e6:.1f}"


def _saved(full, lora) -> str:
    if full is None or lora is None or not full:
        return "n/a"
    return f"{_mb(full - lora)} ({(full - lora) / full:.0%})"


def render_lora(rows: list[dict], reference: dict[str, int]) -> str:
    """The LoRA section of matrix.md.

    Args:
        rows: the matrix's comparison rows (LoRA rows carry "full_twin": full_twin_model's answer).
        reference: measured peak minus other of full fine-tuning cells by cell name (another matrix run).
    """
    measured_full = {
        row["matrix_cell"]: row["peak"]["measured_without_other"]
        for row in rows
        if not row.get("error") and not row.get("lora") and row.get("peak")
    }
    lora_rows = [row for row in rows if row.get("lora") and not row.get("error") and row.get("peak")]
    if not lora_rows:
        return ""
    peaks, categories = [], []
    for row in lora_rows:
        twin_name, twin = row["full_twin_cell"], row.get("full_twin") or {}
        full = measured_full.get(twin_name, reference.get(twin_name))
        lora = row["peak"]["measured_without_other"]
        peaks.append(
            [
                row["matrix_cell"],
                _mb(full),
                _mb(lora),
                _saved(full, lora),
                _mb(twin.get("peak_bytes")),
                _mb(row["peak"]["ours_without_other"]),
                _saved(twin.get("peak_bytes"), row["peak"]["ours_without_other"]),
            ]
        )
        ours_full, ours_lora = twin.get("categories") or {}, row.get("ours_categories") or {}
        measured = row.get("categories") or {}
        for name in CATEGORIES:
            categories.append(
                [
                    row["matrix_cell"],
                    name,
                    _mb(ours_full.get(name)),
                    _mb(ours_lora.get(name)),
                    _mb(measured.get(name)),
                    _saved(ours_full.get(name), ours_lora.get(name)),
                ]
            )
    return (
        "\n".join(
            [
                "## LoRA beside full fine-tuning (MB per rank)\n",
                "Each LoRA cell (r 8, peft's default targets, base frozen) beside its full fine-tuning twin (the same "
                "engine, architecture, ranks, precision, accumulation, checkpointing). Peak = measured peak minus "
                "measured other; the twin's measured peak is from this run or the reference matrix.\n",
                table(
                    [
                        "LoRA cell",
                        "full: measured",
                        "LoRA: measured",
                        "saved (measured)",
                        "full: ours",
                        "LoRA: ours",
                        "saved (ours)",
                    ],
                    peaks,
                )
                + "\n",
                "### By category, at the step boundary (the probe's categories; ours for both, measured for LoRA)\n",
                table(
                    ["LoRA cell", "category", "full: ours", "LoRA: ours", "LoRA: measured", "saved (ours)"],
                    categories,
                ),
            ]
        )
        + "\n"
    )
