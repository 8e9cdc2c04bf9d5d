"""An engine's host work per step beyond the model's terms, fitted on measured steps of a calibrated machine.

    machine = with_host_work(machine, fit_host_work(rows))     # rows: calibration cells, measured vs predicted
    step_time(shape, count, setup, machine).terms["host work (fitted)"]

On CPU ranks the engines differ by more than their FLOPs, bytes and collectives (docs/steptime.md, "Out of
sample on this machine"): DeepSpeed's flattening copies and partition bookkeeping, DDP's bucket views, the hooks
of FSDP2 and ZeRO-3, Python per module, and collectives slower inside a step than alone. That work is per engine
and not counted from first principles here; it is fitted, per engine, as

    seconds = (per_micro_batch_s x accumulation + per_param_s x parameters x reductions)
              / the cores a rank's host work gets
              + per_comm_s x the step's exposed communication as the model prices it

(a fixed cost per forward and backward: Python, hooks; a cost per parameter per gradient reduction: the
per-parameter hooks that fire as gradients arrive and the copies into and out of the reduction's buckets, which
run with the reduction: every micro-batch for engines that reduce every micro-batch (our ZeRO-2/3, DeepSpeed
ZeRO-2/3, FSDP2: the registry's `every_micro_step` reductions), once per step for those that reduce at the
accumulation boundary only (DDP under no_sync, our ZeRO-1, DeepSpeed ZeRO-1): `reductions`), on the residuals
(measured - predicted without it) of calibration cells only, by least squares over the terms a check's design chooses (per_comm_s needs cells with and without
communication: 1 and 2 ranks). The fit is a correction and may be negative where the terms overcount.
"""

from __future__ import annotations

import dataclasses

from zero_train.registry import engine_spec
from zero_train.timing.machine import Machine

TERM = "host work (fitted)"


TERMS = ("per_micro_batch_s", "per_param_s", "per_comm_s")
"""What a fit may hold: seconds per micro-batch and per parameter per gradient reduction on one core, and
seconds per second of the model's exposed communication (its excess: gloo ranks on a loaded machine wait for each other's scheduling)."""


def reductions(engine: str, grad_accum: int) -> int:
    """Gradient reductions per step: one per micro-batch where the engine reduces its gradients every micro-batch
    (registry: a gradient collective with `every_micro_step`), else one at the accumulation boundary."""
    every = any(c.every_micro_step and c.of.startswith("grads") for c in engine_spec(engine).collectives)
    return grad_accum if every else 1


def host_seconds(
    machine: Machine,
    engine: str,
    *,
    grad_accum: int,
    num_params: int,
    ranks_on_node: int,
    comm_s: float = 0.0,
) -> float:
    """The engine's fitted host work per step on this machine (0 without a fit for it); `comm_s`: the step's
    exposed communication as the model prices it."""
    fit = machine.engine_host.get(engine)
    if not fit:
        return 0.0
    per_param = fit.get("per_param_s", 0.0) * num_params * reductions(engine, grad_accum)
    work = fit.get("per_micro_batch_s", 0.0) * grad_accum + per_param
    return work / machine.host_cores_per_rank(ranks_on_node) + fit.get("per_comm_s", 0.0) * comm_s


def fit_host_work(rows: list[dict], terms: tuple[str, ...] = TERMS[:2]) -> dict[str, dict[str, float]]:
    """Per engine, the chosen `terms` (of TERMS) from calibration cells, by least squares.

    Args:
        rows: dict(engine, residual_s (measured - predicted without host work), grad_accum, num_params,
            host_cores (machine.host_cores_per_rank of the cell), comm_s (the model's exposed communication)),
            one per calibration cell.
        terms: which of TERMS to fit; a term whose column is zero in every cell of an engine is fitted as 0.

    Returns:
        {engine: {term: value, ..., "cells": n}}.
    """
    by_engine: dict[str, list[dict]] = {}
    for row in rows:
        by_engine.setdefault(row["engine"], []).append(row)
    fits = {}
    for engine, cells in sorted(by_engine.items()):
        columns = {
            "per_micro_batch_s": [c["grad_accum"] / c["host_cores"] for c in cells],
            "per_param_s": [
                c["num_params"] * reductions(engine, c["grad_accum"]) / c["host_cores"] for c in cells
            ],
            "per_comm_s": [c.get("comm_s", 0.0) for c in cells],
        }
        used = [t for t in terms if any(columns[t])]
        values = _least_squares([columns[t] for t in used], [c["residual_s"] for c in cells])
        fits[engine] = {t: 0.0 for t in terms} | dict(zip(used, values, strict=True)) | {"cells": len(cells)}
    return fits


def _least_squares(columns: list[list[float]], ys: list[float]) -> list[float]:
    """x minimising |A x - y|^2 for A's columns (normal equations, columns scaled to 1); with fewer cells than
    columns, the later columns are dropped (fitted as 0)."""
    dropped = max(0, len(columns) - len(ys))
    columns = columns[: len(ys)]
    scale = [max(abs(v) for v in col) or 1.0 for col in columns]
    cols = [[v / s for v in col] for col, s in zip(columns, scale, strict=True)]
    n = len(cols)
    a = [[sum(x * y for x, y in zip(cols[i], cols[j], strict=True)) for j in range(n)] for i in range(n)]
    b = [sum(x * y for x, y in zip(cols[i], ys, strict=True)) for i in range(n)]
    for i in range(n):  # Gauss-Jordan with partial pivoting
        pivot = max(range(i, n), key=lambda r: abs(a[r][i]))
        a[i], a[pivot], b[i], b[pivot] = a[pivot], a[i], b[pivot], b[i]
        if abs(a[i][i]) < 1e-12:  # column i adds nothing the earlier ones do not: it and the rest fitted as 0
            return (_least_squares(columns[:i], ys) if i else []) + [0.0] * (n - i)
        for r in range(n):
            if r != i:
                f = a[r][i] / a[i][i]
                a[r] = [x - f * y for x, y in zip(a[r], a[i], strict=True)]
                b[r] -= f * b[i]
    return [b[i] / a[i][i] / scale[i] for i in range(n)] + [0.0] * dropped


def with_host_work(machine: Machine, fits: dict[str, dict[str, float]]) -> Machine:
    """The machine with these engines' host work (written to its JSON by as_dict)."""
    table = {e: {k: float(v) for k, v in f.items() if k != "cells"} for e, f in fits.items()}
    return dataclasses.replace(machine, engine_host={**machine.engine_host, **table})
