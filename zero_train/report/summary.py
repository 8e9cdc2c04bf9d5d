"""summary.json: every number of the report, machine-readable; cells.json: the numbers that matter per cell.

    {"schema": "zero_train.report_summary/1", "source": DIR, "peak_goal": 0.1,
     "ratio_convention": "...",
     "groups": [{"model", "precision", "num_params", "world_sizes", "engines",
                 "bytes_per_param": {"model_states": {engine: {world_size: x}}, "peak": {...},
                                     "paper": {stage: {world_size: x}}}}],
     "cells": [comparison row, one per successful cell (zero_train.report.compare) + "explanations"],
     "failed": [{"cell", "engine", "world_size", "precision", "model", "error"}],
     "files": ["report.md", "summary.json", "cells.json", PNG names]}

cells.json (schema zero_train.report_cells/1) is the same object with each cell cut to what tests and docs
read (compact_cell): the cell's settings and DeepSpeed config, measured peak / other / allocator / categories
per rank, the measured and estimated peak per phase, model states beside the paper and DeepSpeed, bytes per
parameter, communication per step, host syncs (without their sites), collectives and overlap per step, CUDA. It drops the per-rank phase series, our model's terms per phase and the
explanations (those are in report.md): docs/ commits it, not summary.json (docs/index.md#results-what-was-measured).

Bytes are per rank (the cell's reported rank: the one with the highest peak; every rank under "ranks").
World sizes are JSON object keys, so they are strings in the file.
"""

from __future__ import annotations

import json
import pathlib

from zero_train.memory.model import theory
from zero_train.report.compare import PEAK_GOAL, engine_index

SCHEMA = "zero_train.report_summary/1"
CELLS_SCHEMA = "zero_train.report_cells/1"
CELL_KEYS = (
    "cell",
    "engine",
    "zero_stage",
    "world_size",
    "precision",
    "model",
    "num_params",
    "micro_batch_size",
    "block_size",
    "grad_accum",
    "gradient_checkpointing",
    "steps",
    "device",
    "lora",
    "ds_config",
    "reported_rank",
    "categories",
    "allocator_bytes",
    "peak_bytes",
    "baseline_bytes",
    "model_states",
    "footprint",
    "peak",
    "cuda",
)
RANK_KEYS = (
    "rank",
    "categories",
    "model_state_bytes",
    "allocator_bytes",
    "peak_bytes",
    "baseline_bytes",
    "other_between_steps",
    "cuda",
    "host_syncs_per_step",
    "collectives_per_step",
    "overlap",
)
SYNC_KEYS = (
    "engine",
    "loop",
    "loop_unlogged",
    "steps_counted",
)  # without the sites (report.md has the counts)
OURS_PEAK_KEYS = ("rank", "peak_phase", "peak_bytes", "phase_bytes")
COMM_KEYS = ("payload", "measured_volume", "paper_volume", "ratio", "sent_bytes")
RATIO_CONVENTION = (
    "memory ratios are estimate / measured (1.00 exact, < 1 the estimate is too low); "
    "communication ratios are measured / paper"
)


def group_key(row: dict) -> tuple[str, str]:
    """Cells are grouped by model and precision (one set of plots and bytes/param tables each)."""
    return (str(row["model"]), str(row["precision"]))


def groups_of(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Successful rows by (model, precision), in row order."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        if row["error"] is None:
            groups.setdefault(group_key(row), []).append(row)
    return groups


def bytes_per_param_table(rows: list[dict]) -> dict:
    """Measured model-state and peak bytes/param by engine and world size, and the paper's by stage."""
    table: dict = {"model_states": {}, "peak": {}, "paper": {}}
    for row in rows:
        for key in ("model_states", "peak"):
            table[key].setdefault(row["engine"], {})[row["world_size"]] = row["bytes_per_param"][key]
        paper = theory.paper_bytes(1, row["world_size"], row["zero_stage"], precision=row["precision"])
        table["paper"].setdefault(row["zero_stage"], {})[row["world_size"]] = paper
    return table


def _group_summary(key: tuple[str, str], rows: list[dict]) -> dict:
    engines = sorted({row["engine"] for row in rows}, key=lambda e: (engine_index(e), e))
    return dict(
        model=key[0],
        precision=key[1],
        num_params=rows[0]["num_params"],
        world_sizes=sorted({row["world_size"] for row in rows}),
        engines=engines,
        bytes_per_param=bytes_per_param_table(rows),
    )


def build_summary(rows: list[dict], *, source: str, files: list[str]) -> dict:
    """The summary.json object.

    Args:
        rows: comparison rows of every cell (failed ones too), with their explanations.
        source: the profile directory the records came from.
        files: the report's file names.
    """
    failed = [
        {key: row[key] for key in ("cell", "engine", "world_size", "precision", "model", "error")}
        for row in rows
        if row["error"] is not None
    ]
    return dict(
        schema=SCHEMA,
        source=source,
        peak_goal=PEAK_GOAL,
        ratio_convention=RATIO_CONVENTION,
        groups=[_group_summary(key, group) for key, group in groups_of(rows).items()],
        cells=[row for row in rows if row["error"] is None],
        failed=failed,
        files=files,
    )


def _pick(values: dict, keys: tuple[str, ...]) -> dict:
    """`values` cut to `keys`, in that order (a key an older record lacks is left out, not invented)."""
    return {key: values[key] for key in keys if key in values}


def compact_cell(row: dict) -> dict:
    """One summary cell cut to the numbers that matter (the module docstring lists them)."""
    cell = _pick(row, CELL_KEYS)
    cell["ranks"] = [_pick(rank, RANK_KEYS) for rank in row["ranks"]]
    for rank in cell["ranks"]:
        if rank.get("host_syncs_per_step"):
            rank["host_syncs_per_step"] = _pick(rank["host_syncs_per_step"], SYNC_KEYS)
    cell["bytes_per_param"] = _pick(row["bytes_per_param"], ("model_states", "peak"))
    cell["ours_peak"] = _pick(row["ours_peak"], OURS_PEAK_KEYS)
    cell["comm"] = _pick(row["comm"], COMM_KEYS)
    return cell


def compact_summary(summary: dict) -> dict:
    """The cells.json object from a summary.json object: same groups and failed cells, compact cells."""
    return dict(
        schema=CELLS_SCHEMA,
        source=summary["source"],
        peak_goal=summary["peak_goal"],
        ratio_convention=summary["ratio_convention"],
        groups=summary["groups"],
        cells=[compact_cell(row) for row in summary["cells"]],
        failed=summary["failed"],
    )


def write_summary(summary: dict, path: pathlib.Path) -> None:
    """Write `summary` as indented JSON (no NaN or infinity: every unknown is null)."""
    path.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")


def write_cells(summary: dict, path: pathlib.Path) -> None:
    """Write cells.json from the summary object: one line per key, and per cell, group and failed cell, so a
    re-measurement diffs cell by cell."""
    lines = []
    for key, value in compact_summary(summary).items():
        if isinstance(value, list) and value:
            items = ",\n  ".join(json.dumps(item, allow_nan=False) for item in value)
            lines.append(f" {json.dumps(key)}: [\n  {items}\n ]")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, allow_nan=False)}")
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")
