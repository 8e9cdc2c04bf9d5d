"""PNG plots (matplotlib, Agg backend: no display needed), one set per (model, precision) group.

- memory_by_category.png: per-rank bytes stacked by category for each engine, one panel per world size,
  the measured peak marked.
- bytes_per_param.png: bytes per parameter against world size. Left: model states, measured points
  per engine beside the paper's curve per stage and DeepSpeed's estimator (stages 2, 3). Right: the
  peak without "other" (what a memory model can predict), measured points beside our peak model's curves
  (zero_train.memory.model.peak).
"""

from __future__ import annotations

import pathlib
import re

import matplotlib
import matplotlib.pyplot as plt

from zero_train.memory.model import theory
from zero_train.memory.model.deepspeed_estimate import deepspeed_estimate
from zero_train.memory.model.peak import backend_for, engine_peak, modelled_engine
from zero_train.memory.record import CATEGORIES
from zero_train.registry import find_engine
from zero_train.report import units
from zero_train.report.compare import engine_index
from zero_train.report.models import model_facts
from zero_train.report.summary import groups_of

CATEGORY_COLORS = {
    "params": "#4c72b0",
    "grads": "#dd8452",
    "master_params": "#937860",
    "optimizer_states": "#55a868",
    "comm_buffers": "#c44e52",
    "activations": "#8172b3",
    "other": "#d9d9d9",
}
STAGE_COLORS = {0: "#4c72b0", 1: "#55a868", 2: "#dd8452", 3: "#c44e52"}
DPI = 110

matplotlib.use("Agg")  # files only: no display, whatever MPLBACKEND says


def _marker(engine: str) -> str:
    spec = find_engine(engine)
    return spec.marker if spec is not None else "o"


def _engines(rows: list[dict]) -> list[str]:
    return sorted({row["engine"] for row in rows}, key=lambda e: (engine_index(e), e))


def plot_categories(rows: list[dict], path: pathlib.Path, title: str) -> None:
    """Stacked bars of the reported rank's categories (MB) per engine, one panel per world size."""
    sizes = sorted({row["world_size"] for row in rows})
    figure, axes = plt.subplots(
        1, len(sizes), figsize=(4.2 * len(sizes) + 1.5, 4.6), sharey=True, squeeze=False
    )
    for axis, world_size in zip(axes[0], sizes, strict=True):
        cells = sorted(
            (r for r in rows if r["world_size"] == world_size),
            key=lambda r: _engines(rows).index(r["engine"]),
        )
        positions = range(len(cells))
        bottoms = [0.0] * len(cells)
        for category in CATEGORIES:
            heights = [cell["categories"][category] / 1e6 for cell in cells]
            axis.bar(
                positions,
                heights,
                bottom=bottoms,
                color=CATEGORY_COLORS[category],
                label=category,
                hatch="//" if category == "other" else None,
                edgecolor="white",
                linewidth=0.5,
            )
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        axis.scatter(
            positions,
            [c["peak_bytes"] / 1e6 for c in cells],
            marker="_",
            s=900,
            color="black",
            linewidths=2,
            label="peak",
            zorder=3,
        )
        axis.set_xticks(list(positions), [cell["engine"] for cell in cells], rotation=30)
        axis.set_title(units.ranks(world_size))
        axis.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("MB per rank (reported rank)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles[::-1], labels[::-1], loc="center right", fontsize=8)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0, 1 - 1.3 / figure.get_figwidth(), 1))
    figure.savefig(path, dpi=DPI)
    plt.close(figure)


def _theory_curves(axis, rows: list[dict], x_values: list[int], largest_layer: int) -> None:
    precision, stages = rows[0]["precision"], sorted({row["zero_stage"] for row in rows})
    for stage in stages:
        paper = [theory.paper_bytes(1, n, stage, precision=precision) for n in x_values]
        axis.plot(x_values, paper, color=STAGE_COLORS[stage], linewidth=1.2, label=f"paper, stage {stage}")
    num_params = rows[0]["num_params"]
    for stage in (s for s in stages if s >= 2):
        estimates = [
            deepspeed_estimate(num_params, n, stage, largest_layer_params=largest_layer) for n in x_values
        ]
        axis.plot(
            x_values,
            [e / num_params for e in estimates],
            color=STAGE_COLORS[stage],
            linestyle="--",
            linewidth=1.2,
            label=f"DeepSpeed estimator, stage {stage}",
        )


def _measured_points(axis, rows: list[dict], value) -> None:
    engines = _engines(rows)
    for index, engine in enumerate(engines):
        cells = sorted((r for r in rows if r["engine"] == engine), key=lambda r: r["world_size"])
        offset = 1 + 0.03 * (index - (len(engines) - 1) / 2)  # a small multiplicative jitter on the log axis
        axis.scatter(
            [c["world_size"] * offset for c in cells],
            [value(c) for c in cells],
            zorder=3,
            s=36,
            marker=_marker(engine),
            color=STAGE_COLORS.get(cells[0]["zero_stage"], "k"),
            edgecolor="black",
            linewidth=0.5,
            label=f"measured {engine}",
        )


def _ours_curves(axis, rows: list[dict], x_values: list[int], facts) -> None:
    first = rows[0]
    settings = dict(
        precision=first["precision"],
        micro_batch_size=first["micro_batch_size"],
        block_size=first["block_size"],
        backend=backend_for(first.get("device")),
    )
    for engine in _engines(rows):
        spec = modelled_engine(engine)
        if spec is None:
            continue
        config = next(r for r in rows if r["engine"] == engine).get("ds_config")
        values = [
            engine_peak(engine, facts.shape, n, ds_config=config, **settings).peak_bytes / first["num_params"]
            for n in x_values
        ]
        axis.plot(
            x_values,
            values,
            color=STAGE_COLORS[spec.stage],
            linewidth=1,
            linestyle=(0, (1 + _engines(rows).index(engine), 1)),
            label=f"ours, {engine}",
        )


def plot_bytes_per_param(rows: list[dict], path: pathlib.Path, title: str) -> None:
    """Bytes/param vs world size: model states with the theory curves; the peak with our peak model."""
    lookup = model_facts(rows[0]["model"], rows[0]["num_params"], rows[0].get("lora"))
    largest = lookup.facts.shape.largest_layer_params if lookup.facts else 0
    sizes = sorted({row["world_size"] for row in rows})
    x_values = list(range(1, max(4, max(sizes)) + 1))
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    _theory_curves(left, rows, x_values, largest)
    _measured_points(left, rows, lambda c: c["bytes_per_param"]["model_states"])
    left.set_title("model states")
    if lookup.facts is not None:
        _ours_curves(right, rows, x_values, lookup.facts)
    _measured_points(right, rows, lambda c: c["peak"]["measured_without_other"] / c["num_params"])
    right.set_title('peak without "other" (what a memory model can predict)')
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xticks(x_values, [str(n) for n in x_values])
        axis.set_xlabel("world size (ranks)")
        axis.set_ylabel("bytes per parameter, per rank")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, ncol=2)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)


def _suffix(key: tuple[str, str], many: bool) -> str:
    return "-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{key[0]}-{key[1]}") if many else ""


def write_plots(rows: list[dict], out: pathlib.Path) -> dict[str, list[str]]:
    """Write every plot into `out`.

    Args:
        rows: comparison rows (failed cells are skipped).
        out: the directory.

    Returns:
        {"categories": [file names], "bytes_per_param": [file names]} (one per model/precision group).
    """
    groups = groups_of(rows)
    files: dict[str, list[str]] = {"categories": [], "bytes_per_param": []}
    for key, group in groups.items():
        suffix = _suffix(key, len(groups) > 1)
        title = f"{key[0]} ({group[0]['num_params']:,} params), {key[1]}"
        categories, per_param = f"memory_by_category{suffix}.png", f"bytes_per_param{suffix}.png"
        plot_categories(group, out / categories, title)
        plot_bytes_per_param(group, out / per_param, title)
        files["categories"].append(categories)
        files["bytes_per_param"].append(per_param)
    return files
