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
communication: 1 and 2 ranks). Every fitted value is at least 0 (non-negative least squares): host work is
work the terms do not count, and a negative cost per micro-batch, parameter, logit or call would predict a step
faster the more it does (design v5's ZeRO-2 fitted -0.9 ns per parameter and came out -34% at 1 rank); where the
terms overcount, the term is 0 and the overcount stays in the error.

Three more terms may be fitted SHARED by every engine (one value each, fitted jointly with the engines' own):

    + (per_logit_s x logits + per_ckpt_layer_s x checkpointed layers) x accumulation / the rank's cores
    + per_call_s x the step's collective calls (at more than one rank)

- per logit element (micro-batch tokens x vocabulary): the loss over the vocabulary and the other non-matmul
  work at the LM head, which the memory-bound term prices at the elementwise rate but which runs slower inside
  a step (exp/log bound, out of cache: torch's profiler put llama-tiny's log-softmax and its backward at 1,024 x
  8,192 at ~53 ms a micro-batch in the step, 19 ms alone; docs/steptime.md, design v4);
- per checkpointed layer per micro-batch: torch's checkpoint's own Python (its saved-tensor hooks and the
  re-entry into each block's forward), ~2.5 ms a layer on gpt2-25m by the profile;
- per collective call: a call inside a step waits for the slowest rank (gloo ranks on shared cores reach it at
  different times), which a collective timed alone does not: it scales with the engine's calls (DeepSpeed's
  per-bucket reductions, ZeRO-3's and FSDP2's per-unit gathers, DDP's few buckets), counted from the engine's
  collectives (registry), not a per-engine factor (designs v5, v6).

Design v7 counts the waits instead of the calls, and prices more ranks than cores:

    + per_sync_s x sync points + per_oversubscribed_sync_s x sync points x (ranks / cores - 1, at least 0)

- per sync point (timing.step.sync_points): a rank waits for its peers where it blocks, not at every call: at
  each call it waits for where it launched it (DeepSpeed ZeRO-1/2's reductions, a unit's gather), once per
  micro-batch for the reductions it launches in backward and waits for at its end (DDP, our ZeRO-1/2/3, FSDP2),
  once for the gathers after the step. Our ZeRO-1/2 make as many bucket calls as DeepSpeed's but wait once: on
  v3-v6's 4-rank cells the model missed them by ~0 s and DeepSpeed ZeRO-1/2 by +0.02 .. +0.30 s;
- per sync point per rank beyond the cores: four single-thread ranks on two cores run two at a time, so the
  last peer reaches a sync point up to a scheduler slice later (its work runs on half a core), where at most one
  rank per core it arrives only a jitter later. If the wait were all the lagging rank's own work, stretched by
  ranks / cores as the host work is, this would equal per_sync_s; fitted on the seen cells it is 0.5-0.7 of it.

Design v10 lets a wait grow with the ranks, per engine:

    + per_sync_peer_s x sync points x (ranks - 1)

- a wait ends when the last of ranks - 1 peers arrives, and a gloo collective over W ranks passes W - 1 ring
  hops, each handed over by a rank's host thread; a fixed cost per wait (per_sync_s) prices 2 ranks and 4 alike.
  Fitted at 1-2 ranks per wait only, DeepSpeed ZeRO-3 (a wait at every unit's fetch) came out low at 4 ranks in
  all seven stored 4-rank cells (median -14%) and high at 1 rank (+16%): its 2-rank waits were priced into its
  per-micro-batch cost (docs/steptime.md, design v10).

Design v11 splits the loss's work at the LM head in two, a part stretched by ranks / cores and a part not:

    + per_logit_rank_s x logits x accumulation

- four single-thread ranks on two cores do not each run at half speed throughout: a rank waiting at a sync point
  gives its core to a peer, so work between waits is stretched by less than ranks / cores. v10's run came out
  high on every 4-rank cell (+4% .. +32%), most on llama-tiny 4 x 64 (vocabulary 32,000), where the per-logit
  cost was the largest host term and was doubled. Fitted beside per_logit_s on v3-v10's stored runs, the two
  split the cost ~40 / 60 (docs/steptime.md, design v11).

Design v13 prices a wait by the work between waits, per engine, in place of a fixed cost per wait:

    + per_sync_work_s x sync points x the step's other terms' seconds (the model's, without host work)

- the last peer reaches a wait late by a share of the work it did since the last one (gloo ranks on shared cores
  drift apart as they run), so a fixed cost per wait, fitted mostly on 0.1-2 s steps, overpriced the 0.04-0.07 s
  ones: leave-one-run-out on v3-v12 their signed median error was +12% (docs/steptime.md, design v13).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from zero_train.registry import engine_spec
from zero_train.timing.machine import Machine

TERM = "host work (fitted)"
SCALE_TERM = "run speed (fitted)"


TERMS = ("per_micro_batch_s", "per_param_s", "per_comm_s", "per_sync_s", "per_sync_peer_s", "per_sync_work_s")
"""What a fit may hold per engine: seconds per micro-batch and per parameter per gradient reduction on one core,
seconds per second of the model's exposed communication (its excess: gloo ranks on a loaded machine wait for
each other's scheduling), and seconds per sync point (design v9: a wait costs each engine its own, DeepSpeed
ZeRO-3's fetch coordinator at every unit more than our ZeRO-3's gather; shared by every engine in v7 and v8),
seconds per sync point per peer (design v10: the wait grows with the ranks it waits for), and seconds per sync
point per second of the step's other terms (design v13: the wait grows with the work between waits)."""

SHARED = (
    "per_logit_s",
    "per_ckpt_layer_s",
    "per_call_s",
    "per_sync_s",
    "per_oversubscribed_sync_s",
    "per_logit_rank_s",
    "per_op_s",
)
"""What a fit may hold shared by every engine: seconds per logit element and per checkpointed layer, each per
micro-batch on one core; seconds per collective call at more than one rank (designs v5, v6); seconds per sync
point (step.sync_points) and per sync point per rank beyond the cores per core (design v7); seconds per logit
element per micro-batch whatever the rank's share of the cores (design v11: fitted beside per_logit_s, it splits
the loss's work into a part stretched by ranks / cores and a part that is not); seconds per ATen op dispatched
per micro-batch on one core (design v16: the eager dispatcher's and the modules' Python cost, which grows with
a model's ops, not its FLOPs)."""


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
    logits: int = 0,
    ckpt_layers: int = 0,
    calls: int = 0,
    sync_points: int = 0,
    world_size: int = 1,
    model_s: float = 0.0,
    ops: int = 0,
) -> float:
    """The engine's fitted host work per step on this machine (0 without a fit for it); `comm_s`: the step's
    exposed communication as the model prices it; `logits`: a micro-batch's tokens x vocabulary;
    `ckpt_layers`: the layers checkpointed (0 without checkpointing); `calls`: the step's collective calls (0 at
    one rank); `sync_points`: where a rank waits for its peers in the step (step.sync_points; 0 at one rank); `world_size`: the ranks of a wait;
    `model_s`: the step's other terms (compute, exposed communication, optimizer), without host work; `ops`: the
    ATen ops a micro-batch's forward + backward dispatches (ActivationCount.ops)."""
    fit = machine.engine_host.get(engine)
    if not fit:
        return 0.0
    row = dict(
        grad_accum=grad_accum,
        num_params=num_params,
        logits=logits,
        ckpt_layers=ckpt_layers,
        calls=calls,
        sync_points=sync_points,
        world_size=world_size,
        host_cores=machine.host_cores_per_rank(ranks_on_node),
        comm_s=comm_s,
        predicted_s=model_s,
        ops=ops,
    )
    return sum(fit.get(term, 0.0) * value for term, value in _columns(engine, row).items())


def _columns(engine: str, row: dict) -> dict[str, float]:
    """What each term is multiplied by in one cell (a row of the fit, or a step to predict)."""
    k, cores = row["grad_accum"], row["host_cores"]
    return {
        "per_micro_batch_s": k / cores,
        "per_param_s": row["num_params"] * reductions(engine, k) / cores,
        "per_comm_s": row.get("comm_s", 0.0),
        "per_logit_s": k * row.get("logits", 0) / cores,
        "per_ckpt_layer_s": k * row.get("ckpt_layers", 0) / cores,
        "per_logit_rank_s": k * row.get("logits", 0),
        "per_call_s": row.get("calls", 0),
        "per_sync_s": row.get("sync_points", 0),
        "per_oversubscribed_sync_s": row.get("sync_points", 0) * max(0.0, 1 / cores - 1),
        "per_sync_peer_s": row.get("sync_points", 0) * max(0, row.get("world_size", 1) - 1),
        "per_sync_work_s": row.get("sync_points", 0) * row.get("predicted_s", 0.0),
        "per_op_s": k * row.get("ops", 0) / cores,
    }


def fit_host_work(
    rows: list[dict], terms: tuple[str, ...] = TERMS[:2], shared: tuple[str, ...] = (), relative: bool = False
) -> dict[str, dict[str, float]]:
    """Per engine, the chosen `terms` (of TERMS) and the `shared` ones (of SHARED, one value for every engine),
    from calibration cells, by least squares with every value at least 0.

    Args:
        rows: dict(engine, residual_s (measured - predicted without host work), grad_accum, num_params,
            host_cores (machine.host_cores_per_rank of the cell), comm_s (the model's exposed communication);
            for shared terms also logits, ckpt_layers, calls (host_seconds' arguments); relative: measured_s),
            one per calibration cell.
        terms: which of TERMS to fit per engine; a term whose column is zero in every cell of an engine is fitted
            as 0.
        shared: which of SHARED to fit jointly with them (one least squares over every engine's cells).
        relative: weight each cell by 1 / its measured step (least squares on relative error, what the check
            judges) rather than on seconds.

    Returns:
        {engine: {term: value, ..., "cells": n}} (the shared terms' values repeated in every engine).
    """
    if both := set(terms) & set(shared):
        raise ValueError(f"{', '.join(sorted(both))}: fitted per engine or shared, not both")
    by_engine: dict[str, list[dict]] = {}
    for row in rows:
        by_engine.setdefault(row["engine"], []).append(row)
    # one least squares over every engine's cells: without shared terms its matrix is block-diagonal (an
    # engine's columns are 0 on other engines' cells), so it is each engine's own fit
    keys = [(None, t) for t in shared] + [(e, t) for e in sorted(by_engine) for t in terms]
    weights = [1 / row["measured_s"] if relative else 1.0 for row in rows]
    columns = {
        (engine, term): [
            w * _columns(row["engine"], row)[term] if engine in (None, row["engine"]) else 0.0
            for row, w in zip(rows, weights, strict=True)
        ]
        for engine, term in keys
    }
    used = [key for key in keys if any(columns[key])]
    targets = [w * row["residual_s"] for row, w in zip(rows, weights, strict=True)]
    values = dict(zip(used, _nonnegative_least_squares([columns[k] for k in used], targets), strict=True))
    return {
        engine: {t: values.get((None, t), 0.0) for t in shared}
        | {t: values.get((engine, t), 0.0) for t in terms}
        | {"cells": len(cells)}
        for engine, cells in sorted(by_engine.items())
    }


def _least_squares(columns: list[list[float]], ys: list[float]) -> list[float]:
    """x minimising |A x - y|^2 for A's columns (normal equations, columns scaled to 1); a column that adds
    nothing the earlier ones do not (collinear with them, or beyond as many independent columns as cells) is
    fitted as 0 and the others are fitted without it."""
    scale = [max(abs(v) for v in col) or 1.0 for col in columns]
    cols = [[v / s for v in col] for col, s in zip(columns, scale, strict=True)]
    n = len(cols)
    a = [[sum(x * y for x, y in zip(cols[i], cols[j], strict=True)) for j in range(n)] for i in range(n)]
    b = [sum(x * y for x, y in zip(cols[i], ys, strict=True)) for i in range(n)]
    for i in range(n):  # Gauss-Jordan with partial pivoting
        pivot = max(range(i, n), key=lambda r: abs(a[r][i]))
        a[i], a[pivot], b[i], b[pivot] = a[pivot], a[i], b[pivot], b[i]
        if abs(a[i][i]) < 1e-12:  # column i is in the span of columns 0..i-1: drop it alone, refit the rest
            rest = _least_squares(columns[:i] + columns[i + 1 :], ys)
            return rest[:i] + [0.0] + rest[i:]
        for r in range(n):
            if r != i:
                f = a[r][i] / a[i][i]
                a[r] = [x - f * y for x, y in zip(a[r], a[i], strict=True)]
                b[r] -= f * b[i]
    return [b[i] / a[i][i] / scale[i] for i in range(n)]


def _nonnegative_least_squares(columns: list[list[float]], ys: list[float]) -> list[float]:
    """x >= 0 minimising |A x - y|^2 (Lawson and Hanson's active set, "Solving Least Squares Problems", 1974,
    ch. 23): start from x = 0; move in the column whose residual correlation is largest while one is positive;
    solve the unconstrained least squares on the columns moved in; where that sends one below 0, step only as
    far as the first reaches 0 and move it out. Columns scaled to 1, as _least_squares."""
    scale = [max(abs(v) for v in col) or 1.0 for col in columns]
    cols = [[v / s for v in col] for col, s in zip(columns, scale, strict=True)]
    n, x, passive, stuck = len(cols), [0.0] * len(cols), [], set()
    tolerance = 1e-12 * max(1.0, max((abs(y) for y in ys), default=0.0))
    for _ in range(10 * n + 10):  # the method ends in finitely many steps; this only bounds a rounding loop
        residual = [y - sum(cols[j][i] * x[j] for j in range(n)) for i, y in enumerate(ys)]
        gradient = [sum(c * r for c, r in zip(col, residual, strict=True)) for col in cols]
        candidates = [j for j in range(n) if j not in passive and j not in stuck and gradient[j] > tolerance]
        if not candidates:
            break
        entering = max(candidates, key=lambda j: gradient[j])
        passive.append(entering)
        while passive:
            z = dict(zip(passive, _least_squares([cols[j] for j in passive], ys), strict=True))
            if all(z[j] > 0 for j in passive):
                x = [z.get(j, 0.0) for j in range(n)]
                break
            if entering in passive and z[entering] <= 0 and x[entering] == 0:
                stuck.add(entering)  # rounding: a column dependent on the others reads a positive gradient
                passive.remove(entering)
                continue
            ratios = {j: x[j] / (x[j] - z[j]) for j in passive if z[j] <= 0}  # how far each may go to 0
            step = min(ratios.values())
            x = [x[j] + step * (z[j] - x[j]) if j in z else 0.0 for j in range(n)]
            passive = [j for j in passive if ratios.get(j, 2.0) > step and x[j] > 0]
            x = [x[j] if j in passive else 0.0 for j in range(n)]
    return [value / s for value, s in zip(x, scale, strict=True)]


def speed_scale(rows: list[dict], reference: list[dict]) -> float:
    """How fast the run `reference` measured ran against the run `rows` measured: the median, over the cells
    both measured (same set and engine: every design's calibration sets), of reference's step / rows' step (1
    where they share none). Design v7's run ran the calibration cells every run shares at 0.75-0.89 of v3-v6's
    times: earlier runs' host work, fitted at their speed, overpriced it (docs/steptime.md, v7's "why it missed")."""
    mine = {(row["set"], row["engine"]): row["measured_s"] for row in reference}
    ratios = [mine[key] / row["measured_s"] for row in rows if (key := (row["set"], row["engine"])) in mine]
    return statistics.median(ratios) if ratios else 1.0


def at_speed(rows: list[dict], scale: float) -> list[dict]:
    """Another run's cells as if measured `scale` times as long (speed_scale): each step, and so its residual
    over the prediction of that run's own calibration, scaled."""
    return [
        row
        | dict(
            measured_s=row["measured_s"] * scale, residual_s=row["measured_s"] * scale - row["predicted_s"]
        )
        for row in rows
    ]


def row_seconds(machine: Machine, row: dict) -> float:
    """One fit row's step (its predicted_s: the terms without host work) with the machine's host work."""
    return row["predicted_s"] + host_seconds(
        machine,
        row["engine"],
        grad_accum=row["grad_accum"],
        num_params=row["num_params"],
        ranks_on_node=row["world_size"],
        comm_s=row["comm_s"],
        logits=row["logits"],
        ckpt_layers=row["ckpt_layers"],
        calls=row["calls"],
        sync_points=row["sync_points"],
        world_size=row["world_size"],
        model_s=row["predicted_s"],
        ops=row.get("ops", 0),
    )


def nearest_rows(rows: list[dict], num_params: int, world_size: int) -> list[dict]:
    """The rows (a run's calibration cells) of the calibration shape nearest in parameters to `num_params`, and
    of those the rank count nearest `world_size` (both on a log scale): the cells a step is scaled by in design
    v13 (run_scale). A run's sets move apart within the run (-14% .. +21% per calibration set, docs/steptime.md,
    design v12); the cells of the shape and ranks nearest a held-out cell carry more of its deviation than all
    of them (v3-v12 leave-one-run-out, design v13)."""

    def nearest(pool: list[dict], key: str, value: int) -> list[dict]:
        best = min(abs(math.log(row[key] / value)) for row in pool)
        return [row for row in pool if abs(math.log(row[key] / value)) == best]

    return nearest(nearest(rows, "num_params", num_params), "world_size", world_size) if rows else []


def run_scale(machine: Machine, rows: list[dict]) -> float:
    """The median over `rows` (the run's own calibration cells) of measured / predicted step with the machine's
    fitted host work: Machine.step_scale (1 without rows). A fit over several runs' cells carries their pooled
    speed, and the run's own calibration cells, a few among hundreds, barely move it; on the shared CPU a run's
    held-out cells are then off by about what its own calibration cells are, every cell alike
    (docs/steptime.md, design v9), so the whole step is scaled by them."""
    ratios = [row["measured_s"] / row_seconds(machine, row) for row in rows]
    return statistics.median(ratios) if ratios else 1.0


def with_host_work(machine: Machine, fits: dict[str, dict[str, float]]) -> Machine:
    """The machine with these engines' host work (written to its JSON by as_dict)."""
    table = {e: {k: float(v) for k, v in f.items() if k != "cells"} for e, f in fits.items()}
    return dataclasses.replace(machine, engine_host={**machine.engine_host, **table})
