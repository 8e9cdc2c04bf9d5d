"""The benchmark's Markdown: one table per precision, the target ratios, and the machine it ran on."""

from __future__ import annotations

from zero_train.bench.cells import BENCH_REGISTRY
from zero_train.bench.compare import check_table
from zero_train.bench.machine import CPU_FLAGS

SHORT = {
    "all_reduce": "AR",
    "reduce_scatter": "RS",
    "all_gather": "AG",
    "broadcast": "BC",
    "reduce": "R",
    "send_recv": "p2p",
}
MB = 1e6


def _spread(values: dict | None, scale: float, digits: int = 0) -> str:
    if values is None:
        return "failed"
    low, mid, high = (values[k] * scale for k in ("min", "median", "max"))
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def _payload(payload: dict) -> str:
    parts = [f"{SHORT[k]} {v / MB:.1f}" for k, v in payload.items() if k in SHORT and v >= 0.05 * MB]
    return " + ".join(parts) or "0"


def _cell_row(cell: dict) -> str:
    spec = BENCH_REGISTRY.get(cell["engine"])
    label = spec.label if spec else cell["engine"]
    if "comm" not in cell:
        return f"| {label} | failed: {cell['errors'][0] if cell['errors'] else '?'} | | | | | | | |"
    comm = cell["comm"]
    peaks = " / ".join(f"{p / MB:.0f}" for p in cell["peak_bytes"])
    return (
        f"| {label} | {_spread(cell['step_time_s'], 1000)} | {_spread(cell['tokens_per_s'], 1)} | "
        f"{_payload(comm['payload'])} | {comm['wire']['total'] / MB:.1f} | {comm['paper_wire'] / MB:.1f} | "
        f"{_ratio(comm['wire_vs_paper'])} | {peaks} ({cell['peak_bytes_per_param']:.1f} B/param) | "
        f"{_per_step(cell.get('per_step'))} |"
    )


def _ratio(value: float | None) -> str:
    """sent / paper; n/a where the paper's volume is 0 (one rank sends nothing)."""
    return "n/a" if value is None else f"{value:.2f}"


def _per_step(counts: dict | None) -> str:
    """host syncs engine / loop, collective calls engine / loop, overlap share (docs/gpu.md)."""
    if counts is None:
        return "not counted"
    share = "n/a" if counts["overlap_share"] is None else f"{counts['overlap_share']:.0%}"
    return (
        f"{counts['engine_syncs']} / {counts['loop_syncs']}; {counts['engine_calls']} / {counts['loop_calls']}; "
        f"{share}"
    )


def cells_table(cells: list[dict]) -> list[str]:
    """Lines of one precision's table."""
    lines = [
        "| engine | step time, ms: median (min-max) | tokens/s | payload per step, MB | sent per step, MB "
        "| paper, MB | sent / paper | peak memory per rank, MB | per step: host syncs engine / loop; "
        "collective calls engine / loop; reduction overlapping backward |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    return lines + [_cell_row(cell) for cell in cells]


def _ratio_text(values: dict | None, what: str = "step") -> str:
    """min / median / max (one value for a single run or the wire bytes) and the verdict."""
    if values is None:
        return "n/a"
    mark = {True: " (met)", False: " (**missed**)", None: ""}[values["met"]]  # None: no target, shown
    if values["n"] == 1 or values["min"] == values["max"]:
        single = f"{values['median']:.6g}" if what == "wire" else f"{values['median']:.3f}"
        return single + (" (1 run)" if what != "wire" else "") + mark
    return f"{values['min']:.3f} / **{values['median']:.3f}** / {values['max']:.3f}{mark}"


def targets_table(targets: list[dict], precisions: list[str]) -> list[str]:
    """Lines of the targets table: min / median / max of the per-repeat ratios per precision; a target whose
    engines were not all benchmarked is left out (a table of n/a rows reads as missing results)."""
    targets = [row for row in targets if any(row["by_precision"].get(p) is not None for p in precisions)]
    lines = [
        "| ratio (min / median / max over repeats) | " + " | ".join(precisions) + " | target |",
        "|---" * (len(precisions) + 2) + "|",
    ]
    for row in targets:
        cells = " | ".join(
            _ratio_text(row["by_precision"].get(p), row.get("what", "step")) for p in precisions
        )
        lines.append(f"| {row['name']} | {cells} | {row['target']} |")
    return lines


def machine_line(result: dict) -> str:
    """One sentence: what it ran on, with what, and how loaded the machine was."""
    machine, meta = result["machine"], result["meta"]
    gpus = ", ".join(machine["gpus"]) or "no GPU"
    flags = machine.get("cpu_flags")
    if flags is not None:
        native = {"avx512_bf16", "amx_bf16"} & set(flags)
        bf16 = "native bf16" if native else "no native bf16 (emulated)"
        gpus += f"; CPU flags {' '.join(flags) or 'none of ' + ', '.join(CPU_FLAGS)}: {bf16}"
    load = result.get("load_average") or {}
    return (
        f"Machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, {gpus}; {machine['os']}; "
        f"Python {machine['python']}, torch {machine['torch']}, deepspeed {machine['deepspeed']}, "
        f"transformers {machine['transformers']}; backend {meta['backend']}. "
        f"Load average (1 min) {(load.get('start') or ['?'])[0]} at start, {(load.get('end') or ['?'])[0]} at end; "
        f"{result['wall_s']:.0f} s in all, {result['started']}."
    )


def _bf16_steps(meta: dict) -> str:
    """The bf16 runs' steps, where they differ (the CPU emulates bf16)."""
    steps, warmup = meta.get("bf16_steps", meta["steps"]), meta.get("bf16_warmup", meta["warmup"])
    repeats = meta.get("bf16_repeats", meta["repeats"])
    if "bf16" not in meta["precisions"] or (steps, warmup, repeats) == (
        meta["steps"],
        meta["warmup"],
        meta["repeats"],
    ):
        return ""
    runs = "one run per cell" if repeats == 1 else f"at most {repeats} runs per cell"
    return (
        f" (bf16: {steps} steps, {warmup} warm-up, {runs}: this CPU emulates bf16, a step takes ~10 fp32 steps' "
        "time and the engines' differences sit inside its noise; memory and bytes on the wire are unaffected)"
    )


def render(result: dict) -> str:
    """The whole Markdown report of a bench result (cli/bench.py's JSON)."""
    meta = result["meta"]
    lines = [
        f"## zero-train bench: {meta['model']} ({meta['num_params'] / 1e6:.1f}M parameters), world size "
        f"{meta['world_size']}, {meta['micro_batch_size']} x {meta['block_size']} tokens per rank per step",
        "",
        f"{meta['steps']} optimizer steps per run, the first {meta['warmup']} dropped as warm-up"
        + _bf16_steps(meta)
        + "; "
        f"{meta['repeats']} repeats of the engines the targets compare ({meta['other_repeats']} of the others), "
        "interleaved (each repeat runs its cells once, in a shuffled order). "
        "Step time: median of a run's steps, min-max over repeats. Payload per collective (CommLedger: "
        "AR all-reduce, RS reduce-scatter, AG all-gather, BC broadcast, p2p send+recv); sent: estimated bytes "
        "a rank puts on the wire; paper: the ZeRO paper's 2 Psi (3 Psi for ZeRO-3) as a ring sends it, "
        "(N-1)/N per rank. Peak: allocator bytes (CPU: glibc, sampled).",
        "",
        machine_line(result),
    ]
    for precision in meta["precisions"]:
        cells = [c for c in result["cells"] if c["precision"] == precision]
        lines += ["", f"### {precision}", "", *cells_table(cells)]
    lines += ["", "### Targets", "", *targets_table(result["targets"], meta["precisions"])]
    if "launch_check" in result:
        lines += ["", "### One launch vs a launch per run", "", *check_table(result["launch_check"])]
    return "\n".join(lines) + "\n"
