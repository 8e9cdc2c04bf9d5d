"""One benchmark run: launch a cell, then read its own outputs into a sample.

Files of repeat k of cell C under the bench directory:

    configs/C.json        the generated DeepSpeed config (the same for every repeat)
    runs/C-rK.jsonl       the run's metrics (one line per optimizer step, rank 0)
    runs/C-rK.json        the training run's record (--memory-report), or the peer's record
    logs/C-rK.log         the launcher's stdout + stderr

A sample keeps what the summary needs: the step times after the warm-up steps and their median, and
per rank the peak allocator bytes and the communication payload of the last step (CommLedger).
"""

from __future__ import annotations

import json
import pathlib
import statistics
import time

from zero_train.bench import ranks
from zero_train.bench.cells import Cell, cell_ds_config, run_argv, run_program, steps_of
from zero_train.ds_config import write_config
from zero_train.launch.cells import last_error_line
from zero_train.runtime.errors import UsageError


def run_paths(out: pathlib.Path, cell: Cell, repeat: int) -> dict[str, pathlib.Path]:
    """Where the run's config, metrics, record and log go."""
    stem = f"{cell.name}-r{repeat}"
    return dict(
        config=out / "configs" / f"{cell.name}.json",
        metrics=out / "runs" / f"{stem}.jsonl",
        record=out / "runs" / f"{stem}.json",
        log=out / "logs" / f"{stem}.log",
    )


def step_times(metrics_path: pathlib.Path) -> list[float]:
    """The per-step wall times of a metrics JSONL (evaluation lines have none)."""
    if not metrics_path.exists():
        return []
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    return [float(line["step_time_s"]) for line in lines if "step_time_s" in line]


def read_ranks(record_path: pathlib.Path) -> list[dict]:
    """Per rank: rank, peak_bytes, comm payload of the last step, host syncs / collectives / overlap per
    counted step (run record or peer record; None where the record has no counters)."""
    record = json.loads(record_path.read_text())
    return [
        dict(
            rank=r["rank"],
            peak_bytes=r["peak_bytes"],
            comm_bytes_per_step=r.get("comm_bytes_per_step") or {},
            host_syncs_per_step=r.get("host_syncs_per_step"),
            collectives_per_step=r.get("collectives_per_step"),
            overlap=r.get("overlap"),
        )
        for r in sorted(record["ranks"], key=lambda r: r["rank"])
    ]


def make_sample(
    cell: Cell, repeat: int, paths: dict, *, warmup: int, wall_s: float, error: str | None
) -> dict:
    """The sample of one finished (or failed) run."""
    sample = dict(cell=cell.name, engine=cell.engine, precision=cell.precision, repeat=repeat, wall_s=wall_s)
    times = step_times(paths["metrics"])
    measured = times[warmup:]
    if error is None and not measured:
        error = f"no step after the {warmup} warm-up steps in {paths['metrics']}"
    if error is None and not paths["record"].exists():
        error = f"no record {paths['record']}"
    sample.update(error=error, step_times_s=times, warmup=warmup)
    if error is None:
        sample["median_step_s"] = statistics.median(measured)
        sample["ranks"] = read_ranks(paths["record"])
    return sample


def run_one(cell: Cell, repeat: int, args, out: pathlib.Path, hidden_size: int | None) -> dict:
    """Launch one run of `cell` and return its sample (a failed run is a sample with "error" set).

    Args:
        cell, repeat: what to run.
        args: the bench flags (model, batch, steps, warmup, launcher, timeout, ...).
        out: the bench directory.
        hidden_size: the model's, for the generated config's "auto" bucket sizes.
    """
    paths = run_paths(out, cell, repeat)
    for path in (paths["metrics"], paths["record"]):
        path.unlink(missing_ok=True)
    try:
        write_config(cell_ds_config(cell, args, hidden_size), paths["config"])
    except UsageError as err:
        return make_sample(
            cell, repeat, paths, warmup=steps_of(cell, args)[1], wall_s=0.0, error=f"config: {err}"
        )
    started = time.perf_counter()
    code = ranks.launch(args, run_argv(cell, args, paths), paths["log"], **run_program(cell, args))
    wall_s = time.perf_counter() - started
    error = None
    if code is None:
        error = f"timed out after {args.timeout:g} s (see {paths['log']})"
    elif code != 0:
        error = f"exit code {code}: {last_error_line(paths['log'].read_text())}"
    return make_sample(cell, repeat, paths, warmup=steps_of(cell, args)[1], wall_s=wall_s, error=error)
