"""One launch vs a launch per run (`zero-train bench --launch compare`): do the two give the same ratios?

The default bench runs every engine in turn in ONE launch. That stands in for a launch per run only if an
engine runs as fast after the others, in a process that already trained them, as in a fresh process.
`--launch compare` measures it in one go: every repeat is run both ways back to back (its runs in one
launch, and each run in its own launch; which way goes first alternates with the repeat, so that a drift in
machine load does not side with one way), and the report sets, per target ratio and per cell, the
one-launch median beside the per-run median.

The yardstick is the step-to-step noise. A cell's: the median, over its runs of both ways, of the
coefficient of variation (stdev / mean) of the steps measured after warm-up. A ratio's: the root sum of
squares of its two cells'. A step-time or tokens/s ratio (or a cell's step time) "agrees" when its one-launch
and per-run medians differ by no more than that noise; bytes on the wire must be equal. A cell whose runs
measure a single step has no noise estimate, and no verdict.

    check = launch_check(once_samples, per_run_samples, once_targets, per_run_targets)
    lines = check_table(check)
"""

from __future__ import annotations

import math
import pathlib
import statistics
import sys

from zero_train.bench.one_launch import run_all
from zero_train.bench.run import run_one
from zero_train.bench.summary import WIRE_TOLERANCE


def run_both(order: list, args, out: pathlib.Path, hidden_size: int | None) -> tuple[list[dict], list[dict]]:
    """Every (repeat, cell) of `order` in one launch per repeat and in a launch per run, repeat by repeat.

    Returns (one-launch samples, per-run samples), each in `order`. Their files go under OUT/once and
    OUT/per-run (the same layout as a bench of that way alone).
    """
    once, per_run = [], []
    for repeat in sorted({r for r, _ in order}):
        runs = [(r, cell) for r, cell in order if r == repeat]
        ways = ("once", "per-run") if repeat % 2 == 0 else ("per-run", "once")
        for way in ways:
            where = out / way
            for sub in ("configs", "runs", "logs"):
                (where / sub).mkdir(parents=True, exist_ok=True)
            print(f"bench: repeat {repeat}, {len(runs)} runs {_WAYS[way]}", file=sys.stderr, flush=True)
            if way == "once":
                once += run_all(runs, args, where, hidden_size, label=f"r{repeat}-")
            else:
                per_run += [run_one(cell, r, args, where, hidden_size) for r, cell in runs]
    index = {(r, cell.name): i for i, (r, cell) in enumerate(order)}
    return tuple(
        sorted(samples, key=lambda s: index[(s["repeat"], s["cell"])]) for samples in (once, per_run)
    )


_WAYS = {"once": "in one launch", "per-run": "in a launch each"}


def run_noise(sample: dict) -> float | None:
    """Coefficient of variation of a run's measured steps (None: failed, or fewer than 2 measured steps)."""
    if sample.get("error") is not None:
        return None
    measured = sample["step_times_s"][sample["warmup"] :]
    if len(measured) < 2:
        return None
    return statistics.stdev(measured) / statistics.mean(measured)


def cell_noise(samples: list[dict]) -> dict[str, float | None]:
    """Per cell: the median of its runs' step-to-step coefficients of variation."""
    by_cell: dict[str, list[float]] = {}
    for sample in samples:
        by_cell.setdefault(sample["cell"], [])
        noise = run_noise(sample)
        if noise is not None:
            by_cell[sample["cell"]].append(noise)
    return {cell: statistics.median(values) if values else None for cell, values in by_cell.items()}


def _median_step(samples: list[dict], cell: str) -> float | None:
    medians = [s["median_step_s"] for s in samples if s["cell"] == cell and s.get("error") is None]
    return statistics.median(medians) if medians else None


def _verdict(once: float | None, per_run: float | None, noise: float | None, *, exact: bool = False) -> dict:
    """The two medians, their relative difference, the noise and whether they agree (None: no verdict)."""
    row = dict(once=once, per_run=per_run, difference=None, noise=noise, agree=None)
    if once is None or per_run is None:
        return row
    row["difference"] = once / per_run - 1
    if exact:
        row["noise"] = WIRE_TOLERANCE
        row["agree"] = abs(row["difference"]) <= WIRE_TOLERANCE
    elif noise is not None:
        row["agree"] = abs(row["difference"]) <= noise
    return row


def launch_check(
    once: list[dict], per_run: list[dict], once_targets: list[dict], per_run_targets: list[dict]
) -> dict:
    """Cells and target ratios, one launch against a launch per run.

    Args:
        once, per_run: the samples of the two ways (the same cells and repeats).
        once_targets, per_run_targets: summary.target_ratios of each.

    Returns:
        {"cells": [{cell, once, per_run, difference, noise, agree}], "ratios": [{name, precision, what,
        once, per_run, difference, noise, agree}], "agree": every verdict that could be given agrees}.
    """
    noise = cell_noise(once + per_run)
    cells = []
    for cell in dict.fromkeys(s["cell"] for s in once + per_run):
        cells.append(
            dict(
                cell=cell, **_verdict(_median_step(once, cell), _median_step(per_run, cell), noise.get(cell))
            )
        )
    per_run_rows = {row["name"]: row for row in per_run_targets}
    ratios = []
    for row in once_targets:
        other = per_run_rows.get(row["name"])
        for precision, values in row["by_precision"].items():
            twin = other["by_precision"].get(precision) if other else None
            if values is None and twin is None:
                continue  # a cell the bench did not run
            parts = [noise.get(f"{row[side]}-{precision}") for side in ("numerator", "denominator")]
            ratio_noise = math.hypot(*parts) if None not in parts else None
            verdict = _verdict(
                values and values["median"], twin and twin["median"], ratio_noise, exact=row["what"] == "wire"
            )
            ratios.append(dict(name=row["name"], precision=precision, what=row["what"], **verdict))
    verdicts = [row["agree"] for row in cells + ratios if row["agree"] is not None]
    return dict(cells=cells, ratios=ratios, agree=bool(verdicts) and all(verdicts))


def _number(value: float | None, what: str) -> str:
    if value is None:
        return "failed"
    return (
        f"{value * 1000:.1f} ms" if what == "cell" else f"{value:.6g}" if what == "wire" else f"{value:.3f}"
    )


def _row(label: str, row: dict, what: str) -> str:
    difference = "n/a" if row["difference"] is None else f"{row['difference']:+.1%}"
    noise = "n/a" if row["noise"] is None else f"{row['noise']:.1%}"
    if what == "wire":
        noise = "equal bytes"
    verdict = {True: "agree", False: "**differ**", None: "no verdict (one measured step)"}[row["agree"]]
    if row["once"] is None or row["per_run"] is None:
        verdict = "no verdict (a run failed)"
    return (
        f"| {label} | {_number(row['once'], what)} | {_number(row['per_run'], what)} | {difference} | "
        f"{noise} | {verdict} |"
    )


def check_table(check: dict) -> list[str]:
    """Lines of the Markdown section: target ratios, then every cell's step time."""
    header = "| {} | one launch (median) | a launch per run (median) | difference | step noise | |"
    lines = [
        "One launch against a launch per run, every repeat run both ways back to back. Step noise: the "
        "median coefficient of variation of a run's measured steps (a ratio: both cells' in quadrature); "
        "a difference within it agrees. "
        + ("All verdicts agree." if check["agree"] else "**Not every verdict agrees.**"),
        "",
        header.format("ratio"),
        "|---|---|---|---|---|---|",
    ]
    lines += [_row(f"{r['name']} ({r['precision']})", r, r["what"]) for r in check["ratios"]]
    lines += ["", header.format("cell step time"), "|---|---|---|---|---|---|"]
    lines += [_row(c["cell"], c, "cell") for c in check["cells"]]
    return lines
