"""Run records: the JSON one instrumented training run writes (`scripts/train.py --memory-report FILE`).

One record per (engine, world size, ...) cell; `zero-train profile` collects them, `zero-train report`
reads them. The schema (SCHEMA below; validate_record checks every record read):

    {"schema": "zero_train.run_record/1", "engine": "ds2", "zero_stage": 2, "model": "tiny",
     "num_params": 640768, "precision": "fp32", "world_size": 2, "micro_batch_size": 2, "grad_accum": 1,
     "gradient_checkpointing": false, "block_size": 64, "device": "cpu", "ds_config": {...}, "steps": 3,
     "step_time_s": {"median", "min", "max"}, "tokens_per_s": 1234.0,
     "ranks": [{"rank", "phases": [{"name", "current_bytes", "peak_bytes"}], "categories": {...},
                "allocator_bytes", "peak_bytes", "comm_bytes_per_step": {...} | null,
                "other_between_steps": int | null (optional; records before it lack the key),
                "off_device_bytes": {category: bytes stored off the measured device} (optional),
                "cuda": null | {"max_allocated_bytes", "max_reserved_bytes", "reserved_bytes", "free_bytes",
                                "total_bytes", "outside_allocator_bytes"} (optional; CUDA runs),
                "host_syncs_per_step": null | {"engine", "loop", "loop_unlogged", "first_step", "steps_counted",
                                               "sites"} (optional, like the two below),
                "collectives_per_step": null | {"engine", "loop" (calls), "bytes": {"engine", "loop"},
                                                "by_collective": {section: {name: {"calls", "bytes"}}}},
                "overlap": null | {"share", "reduced_bytes", "overlapped_bytes"}}],
     "error": null | "one line"}

Per rank, CATEGORIES plus "other" sum exactly to allocator_bytes (see zero_train.memory.probe for
when each number is taken).
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile

from zero_train.runtime.errors import UsageError

SCHEMA = "zero_train.run_record/1"
PHASES = ("model_built", "engine_initialized", "forward", "backward", "step")
MODEL_STATE_CATEGORIES = ("params", "grads", "master_params", "optimizer_states")
CATEGORIES = (*MODEL_STATE_CATEGORIES, "comm_buffers", "activations", "other")
COMM_KEYS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "total")
REQUIRED_KEYS = ("schema", "engine", "world_size", "ranks", "error")


def empty_record(**meta) -> dict:
    """A record with every schema key present (None / empty where unknown), updated with `meta`."""
    record = dict(
        schema=SCHEMA,
        engine=None,
        zero_stage=None,
        model=None,
        num_params=None,
        precision=None,
        world_size=None,
        micro_batch_size=None,
        grad_accum=None,
        gradient_checkpointing=None,
        block_size=None,
        device=None,
        ds_config=None,
        steps=0,
        step_time_s=None,
        tokens_per_s=None,
        ranks=[],
        error=None,
    )
    record.update(meta)
    return record


def error_record(error: str, **meta) -> dict:
    """The record of a cell that failed: its settings, no ranks, and `error` (one line)."""
    return empty_record(error=error, **meta)


def _rank_problems(rank: dict) -> list[str]:
    problems = []
    categories = rank.get("categories", {})
    missing = [name for name in CATEGORIES if name not in categories]
    if missing:
        problems.append(f"rank {rank.get('rank')}: categories lack {', '.join(missing)}")
    elif sum(categories[name] for name in CATEGORIES) != rank.get("allocator_bytes"):
        problems.append(f"rank {rank.get('rank')}: categories + other != allocator_bytes")
    return problems


def validation_problems(record: dict) -> list[str]:
    """Everything wrong with `record` against the schema (empty list: valid)."""
    if not isinstance(record, dict):
        return ["a run record must be a JSON object"]
    problems = [f"missing key {key!r}" for key in REQUIRED_KEYS if key not in record]
    if record.get("schema") != SCHEMA:
        problems.append(f"schema is {record.get('schema')!r}, expected {SCHEMA!r}")
    if record.get("error") is None:
        ranks = record.get("ranks") or []
        if len(ranks) != record.get("world_size"):
            problems.append(f"{len(ranks)} ranks recorded for world_size {record.get('world_size')}")
        for rank in ranks:
            problems += _rank_problems(rank)
    return problems


def validate_record(record: dict, *, source: str = "run record") -> dict:
    """Return `record` if it follows the schema, else raise UsageError naming the first problem.

    Args:
        record: a parsed run record.
        source: what to call it in the message (usually its path).
    """
    problems = validation_problems(record)
    if problems:
        raise UsageError(
            f"{source}: {problems[0]} (not a zero_train run record? regenerate it)", problems[1:]
        )
    return record


def load_record(path) -> dict:
    """Read and validate one run record JSON file (UsageError if missing, not JSON, or off-schema)."""
    path = pathlib.Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"run record {path} does not exist; check the path") from None
    except (OSError, json.JSONDecodeError) as err:
        raise UsageError(f"run record {path} is unreadable or not JSON ({err})") from None
    return validate_record(record, source=str(path))


def load_records(directory) -> list[dict]:
    """Every run record of a profile directory (`DIR/cells/*.json`, else `DIR/*.json`), sorted by path."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise UsageError(f"{directory} is not a directory of run records (see `zero-train profile --out`)")
    cells = directory / "cells"
    paths = sorted((cells if cells.is_dir() else directory).glob("*.json"))
    if not paths:
        raise UsageError(
            f"no run records (*.json) in {directory}; run `zero-train profile --out {directory}`"
        )
    return [load_record(path) for path in paths]


def write_record(record: dict, path) -> pathlib.Path:
    """Write `record` as indented JSON, atomically (a reader never sees half a file)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
        json.dump(record, handle, indent=2, sort_keys=False)
        handle.write("\n")
    os.replace(handle.name, path)
    return path
