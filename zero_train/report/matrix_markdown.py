"""matrix.md of the out-of-sample memory matrix (scripts/memory_matrix.py): the headline figure, its
distribution overall and by factor, and every cell with its phases."""

from __future__ import annotations

from zero_train.report import units
from zero_train.report.markdown import table
from zero_train.report.matrix import missing_term


def _mb(value) -> str:
    return "n/a" if value is None else f"{value / 1e6:.1f}"


def _ratio(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _distribution(dist: dict) -> str:
    return f"{_ratio(dist['min'])} / {_ratio(dist['median'])} / {_ratio(dist['max'])}"


def _cell_row(row: dict, goal: float) -> list[str]:
    if row.get("error"):
        return [row["matrix_cell"], "FAILED: " + str(row["error"])[:120], *[""] * 9]
    peak = row["peak"]
    ratio = peak["ratio_without_other"]
    phases = peak["phases"]
    return [
        row["matrix_cell"],
        _mb(peak["measured"]),
        _mb(peak["other"]),
        _mb(peak.get("baseline")),
        _mb(peak["measured_without_other"]),
        _mb(peak["ours_without_other"]),
        _ratio(ratio),
        "yes" if abs(ratio - 1) <= goal else "**no**",
        f"{peak['ours_phase']} / {peak['measured_phase']}",
        units.ratio_text(phases["forward"]["ratio"]),
        units.ratio_text(phases["step"]["ratio"]),
    ]


def render_matrix(summary: dict, rows: list[dict], goal: float) -> str:
    """The Markdown page of one matrix run."""
    done = summary["cells"] - len(summary["failed"])
    lines = [
        "# Out-of-sample memory matrix\n",
        f"**{summary['within']} of {done} cells within {goal:.0%}** ({summary['cells']} of the "
        f"{summary.get('design_cells', summary['cells'])} cells of the design recorded, "
        f"{len(summary['failed'])} failed). "
        "Headline: ours ÷ (peak − other), our predicted peak alone against the measured peak minus the "
        'measured "other" (the largest over the ranks). min / median / max:\n',
        f"- ours ÷ (peak − other): {_distribution(summary['ratio'])}",
        f"- (ours + process baseline before the model) ÷ peak: {_distribution(summary['ratio_with_baseline'])}",
        f"- old figure, (ours + measured other) ÷ peak: {_distribution(summary['ratio_with_other'])}\n",
        "## By factor (ours ÷ (peak − other), min / median / max)\n",
    ]
    factor_rows = [
        [factor, level, _distribution(dist)]
        for factor, levels in summary["by_factor"].items()
        for level, dist in sorted(levels.items())
    ]
    lines.append(table(["factor", "level", "min / median / max"], factor_rows) + "\n")
    misses = [
        row for row in rows if not row.get("error") and abs(row["peak"]["ratio_without_other"] - 1) > goal
    ]
    lines.append(f"## Cells outside {goal:.0%} ({len(misses)}), with the term that misses\n")
    lines += [
        f"- {row['matrix_cell']}: {_ratio(row['peak']['ratio_without_other'])}; {missing_term(row)}"
        for row in misses
    ]
    lines.append("\n## Cells (MB per rank)\n")
    header = [
        "cell",
        "peak",
        "other",
        "baseline",
        "peak − other",
        "ours",
        "ours ÷ (peak − other)",
        f"within {goal:.0%}",
        "peak phase: ours / measured",
        "fwd+bwd ours ÷ meas.",
        "step ours ÷ meas.",
    ]
    lines.append(table(header, [_cell_row(row, goal) for row in rows]))
    return "\n".join(lines) + "\n"
