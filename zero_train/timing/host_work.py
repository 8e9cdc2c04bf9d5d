"""An engine's host work per step beyond the model's terms, fitted on measured steps of a calibrated machine.

    machine = with_host_work(machine, fit_host_work(rows))     # rows: calibration cells, measured vs predicted
    step_time(shape, count, setup, machine).terms["host work (fitted)"]

On CPU ranks the engines differ by more than their FLOPs, bytes and collectives: at one rank, where nothing is
communicated and every engine updates the whole model, DDP, our ZeRO-1 and DeepSpeed's stage 1 took 1.02, 0.68
and 1.59 s a step (docs/steptime.md): DeepSpeed's flattening copies and partition bookkeeping, DDP's bucket
views, the hooks of FSDP2 and ZeRO-3, Python per module. That work is per engine and not counted from first
principles here; it is fitted, per engine, as

    seconds = (per_micro_batch_s x accumulation + per_param_s x parameters) / the cores a rank's host work gets

(a fixed cost per forward and backward: Python, hooks; a cost per parameter per step: copies over the
gradients and the optimizer's state), on the residuals (measured - predicted without it) of calibration cells
only, by least squares: exact with two cells of different sizes, one cell gives per_micro_batch_s alone. The
fit is a correction and may be negative where the terms overcount (e.g. a collective's latency).
"""

from __future__ import annotations

import dataclasses

from zero_train.timing.machine import Machine

TERM = "host work (fitted)"


def host_seconds(
    machine: Machine, engine: str, *, grad_accum: int, num_params: int, ranks_on_node: int
) -> float:
    """The engine's fitted host work per step on this machine (0 without a fit for it)."""
    fit = machine.engine_host.get(engine)
    if not fit:
        return 0.0
    work = fit["per_micro_batch_s"] * grad_accum + fit["per_param_s"] * num_params
    return work / machine.host_cores_per_rank(ranks_on_node)


def fit_host_work(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per engine, per_micro_batch_s and per_param_s from calibration cells.

    Args:
        rows: dict(engine, residual_s (measured - predicted without host work), grad_accum, num_params,
            host_cores (machine.host_cores_per_rank of the cell)), one per calibration cell.

    Returns:
        {engine: {"per_micro_batch_s", "per_param_s", "cells"}}.
    """
    by_engine: dict[str, list[dict]] = {}
    for row in rows:
        by_engine.setdefault(row["engine"], []).append(row)
    fits = {}
    for engine, cells in sorted(by_engine.items()):
        xs = [(c["grad_accum"], float(c["num_params"])) for c in cells]
        ys = [c["residual_s"] * c["host_cores"] for c in cells]
        fits[engine] = dict(zip(("per_micro_batch_s", "per_param_s"), _least_squares(xs, ys), strict=True))
        fits[engine]["cells"] = len(cells)
    return fits


def _least_squares(xs: list[tuple[float, float]], ys: list[float]) -> tuple[float, float]:
    """(a, b) minimising sum (a x0 + b x1 - y)^2; b = 0 when the x1 do not vary (one size measured)."""
    s00 = sum(x0 * x0 for x0, _ in xs)
    s01 = sum(x0 * x1 for x0, x1 in xs)
    s11 = sum(x1 * x1 for _, x1 in xs)
    t0 = sum(x0 * y for (x0, _), y in zip(xs, ys, strict=True))
    t1 = sum(x1 * y for (_, x1), y in zip(xs, ys, strict=True))
    det = s00 * s11 - s01 * s01
    if abs(det) <= 1e-9 * s00 * s11:
        return t0 / s00, 0.0
    return (t0 * s11 - t1 * s01) / det, (s00 * t1 - s01 * t0) / det


def with_host_work(machine: Machine, fits: dict[str, dict[str, float]]) -> Machine:
    """The machine with these engines' host work (written to its JSON by as_dict)."""
    table = {e: {k: float(v) for k, v in f.items() if k != "cells"} for e, f in fits.items()}
    return dataclasses.replace(machine, engine_host={**machine.engine_host, **table})
