"""From the runs' samples to per-cell numbers and the issue's target ratios (pure: no processes, no files).

Per cell, over its repeats: the per-run median step time (after warm-up) as min / median / max, tokens/s
from it, per rank the peak allocator bytes, and the communication of one step: the CommLedger's payload
per collective, the bytes actually sent (memory.comm.wire_from_payload: gloo's reduce-scatter is an
all-reduce underneath; p2p payload counts both ends) and the ZeRO paper's volume for the stage, 2 Psi
(DDP, ZeRO-1/2) or 3 Psi (ZeRO-3) elements, which a ring sends as (N-1)/N of it per rank.

Ratios pair the runs of one repeat (they ran next to each other, under the same machine noise) and give
min / median / max over the repeats.
"""

from __future__ import annotations

import statistics

from zero_train.bench.targets import TARGETS
from zero_train.comm.ledger import paper_volume_bytes, wire_from_payload

ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
WIRE_TOLERANCE = 1e-3
"""Relative slack of the wire-bytes target: our sharders all-reduce two floats per tensor (norm, has-gradient
flag) plus one (fp16 overflow) to agree on the step: 1.0e-4 of Psi on the 0.64M-parameter tiny model, 1.2e-5
on gpt2-25m."""


def spread(values: list[float]) -> dict[str, float] | None:
    """{"min", "median", "max", "n"} of `values` (None when empty)."""
    if not values:
        return None
    return dict(min=min(values), median=statistics.median(values), max=max(values), n=len(values))


def comm_summary(payload: dict[str, int], *, stage: int, precision: str, meta: dict) -> dict:
    """Payload, bytes sent and the paper's volume of one rank's step.

    Args:
        payload: the CommLedger's payload per collective (a rank's comm_bytes_per_step).
        stage: ZeRO stage of the cell (0: DDP).
        precision: of the model (the communicated gradients and parameters).
        meta: num_params, world_size, backend.
    """
    world_size = meta["world_size"]
    wire = wire_from_payload(payload, world_size, meta["backend"])
    paper = paper_volume_bytes(stage, meta["num_params"], ELEMENT_BYTES[precision])
    paper_wire = paper * (world_size - 1) / world_size  # what a ring sends of it per rank
    return dict(
        payload=dict(payload),
        wire=wire,
        paper_volume=paper,
        paper_wire=paper_wire,
        wire_vs_paper=wire["total"] / paper_wire if paper_wire else None,
    )


def cell_summary(samples: list[dict], *, stage: int, meta: dict) -> dict:
    """Numbers of one cell over its repeats (failed runs listed under "errors")."""
    ok = [s for s in samples if s["error"] is None]
    first = samples[0]
    summary = dict(cell=first["cell"], engine=first["engine"], precision=first["precision"], runs=len(ok))
    summary["errors"] = [f"repeat {s['repeat']}: {s['error']}" for s in samples if s["error"] is not None]
    medians = [s["median_step_s"] for s in ok]
    summary["step_time_s"] = spread(medians)
    summary["tokens_per_s"] = spread([meta["tokens_per_step"] / m for m in medians])
    if not ok:
        return summary
    last = ok[-1]["ranks"]
    summary["comm"] = comm_summary(
        last[0]["comm_bytes_per_step"], stage=stage, precision=first["precision"], meta=meta
    )
    payloads = [r["comm_bytes_per_step"] for s in ok for r in s["ranks"]]
    summary["comm"]["same_on_all_ranks_and_runs"] = all(p == payloads[0] for p in payloads)
    peaks = [max(s["ranks"][i]["peak_bytes"] for s in ok) for i in range(len(last))]
    summary["peak_bytes"] = peaks
    summary["peak_bytes_per_param"] = max(peaks) / meta["num_params"]
    summary["per_step"] = per_step_counts(last)
    return summary


def per_step_counts(ranks: list[dict]) -> dict | None:
    """The worst rank's host syncs (engine, logged loop step), collective calls (engine, loop) and overlap share
    of a run's counted steps (zero_train.comm.step_counters); None if the run counted none (the HF peer)."""
    counted = [r for r in ranks if r.get("host_syncs_per_step") and r.get("collectives_per_step")]
    if not counted:
        return None
    shares = [r["overlap"]["share"] for r in counted if (r.get("overlap") or {}).get("share") is not None]
    return dict(
        engine_syncs=max(r["host_syncs_per_step"]["engine"] for r in counted),
        loop_syncs=max(r["host_syncs_per_step"]["loop"] or 0 for r in counted),
        engine_calls=max(r["collectives_per_step"]["engine"] for r in counted),
        loop_calls=max(r["collectives_per_step"]["loop"] for r in counted),
        overlap_share=max(shares) if shares else None,
    )


def _median_step(samples_by_cell: dict, engine: str, precision: str, repeat: int) -> float | None:
    sample = samples_by_cell.get((f"{engine}-{precision}", repeat))
    return None if sample is None or sample["error"] is not None else sample["median_step_s"]


def target_ratios(samples: list[dict], cells: dict[str, dict], precisions: list[str]) -> list[dict]:
    """The issue's targets per precision: min / median / max over repeats of the paired ratios.

    Args:
        samples: every run's sample.
        cells: cell name -> cell_summary.
        precisions: the precisions benchmarked.
    """
    by_cell = {(s["cell"], s["repeat"]): s for s in samples}
    repeats = sorted({s["repeat"] for s in samples})
    rows = []
    for name, numerator, denominator, what, comparison in TARGETS:
        row = dict(
            name=name,
            numerator=numerator,
            denominator=denominator,
            what=what,
            target=comparison,
            by_precision={},
        )
        for precision in precisions:
            if what == "wire":  # the same bytes in every repeat: one value
                values = _wire_ratio(cells, numerator, denominator, precision)
            else:
                values = _paired_ratios(by_cell, repeats, numerator, denominator, precision, what)
            row["by_precision"][precision] = _verdict(spread(values), comparison, what)
        rows.append(row)
    return rows


def _paired_ratios(by_cell, repeats, numerator, denominator, precision, what) -> list[float]:
    ratios = []
    for repeat in repeats:
        top = _median_step(by_cell, numerator, precision, repeat)
        bottom = _median_step(by_cell, denominator, precision, repeat)
        if top is not None and bottom is not None:
            ratios.append(top / bottom if what == "step" else bottom / top)  # tokens/s: inverse of time
    return ratios


def _wire_ratio(cells: dict, numerator: str, denominator: str, precision: str) -> list[float]:
    top, bottom = cells.get(f"{numerator}-{precision}"), cells.get(f"{denominator}-{precision}")
    if not top or not bottom or "comm" not in top or "comm" not in bottom:
        return []
    if not bottom["comm"]["wire"]["total"]:  # one rank: nothing on the wire, no ratio
        return []
    return [top["comm"]["wire"]["total"] / bottom["comm"]["wire"]["total"]]


def _verdict(values: dict | None, comparison: str, what: str) -> dict | None:
    """Attach "met": the median ratio on the right side of 1 (wire: within WIRE_TOLERANCE)."""
    if values is None:
        return None
    slack = WIRE_TOLERANCE if what == "wire" else 0.0
    median = values["median"]
    if comparison == "-":
        values["met"] = None  # measured, no target
        return values
    bound = float(comparison.split()[1])  # "<= 1", "<= 0.8", ">= 1"
    values["met"] = median <= bound + slack if comparison.startswith("<=") else median >= bound
    return values
