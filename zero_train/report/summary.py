"""summary.json: every number of the report, machine-readable.

    {"schema": "zero_train.report_summary/1", "source": DIR, "peak_goal": 0.1,
     "ratio_convention": "...",
     "groups": [{"model", "precision", "num_params", "world_sizes", "engines",
                 "bytes_per_param": {"model_states": {engine: {world_size: x}}, "peak": {...},
                                     "paper": {stage: {world_size: x}}}}],
     "cells": [comparison row, one per successful cell (zero_train.report.compare) + "explanations"],
     "failed": [{"cell", "engine", "world_size", "precision", "model", "error"}],
     "files": ["report.md", "summary.json", PNG names]}

Bytes are per rank (the cell's reported rank: the one with the highest peak; every rank under "ranks").
World sizes are JSON object keys, so they are strings in the file.
"""

from __future__ import annotations

import json
import pathlib

from zero_train.memory.model import theory
from zero_train.report.compare import PEAK_GOAL, engine_index

SCHEMA = "zero_train.report_summary/1"
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


def write_summary(summary: dict, path: pathlib.Path) -> None:
    """Write `summary` as indented JSON (no NaN or infinity: every unknown is null)."""
    path.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
