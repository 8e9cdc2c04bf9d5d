"""The checks that measure: peak memory against `estimate`, the GPU margin's terms beside what it assumes, and
speed (step time, tokens/s, the ratios docs/bench.md targets, MFU, host syncs, collectives, overlap).

Only the peak is asserted (within PEAK_GOAL of our model, as the memory report holds every cell); the rest are
measurements printed beside our models' assumptions: a step-time ratio on a shared machine is no verdict.
"""

from __future__ import annotations

import pathlib

from zero_train.acceptance.check import Check, cannot_run, failed, measured, read_json, within
from zero_train.acceptance.plan import Run
from zero_train.bench.targets import TARGETS
from zero_train.memory.model.gpu_terms import GpuMargin, transient
from zero_train.registry import find_engine
from zero_train.report.compare import PEAK_GOAL, compare_cell
from zero_train.report.models import model_facts
from zero_train.timing.presets import GPUS

COUNTERS = {
    "host_syncs_per_step": ("engine", "loop", "loop_unlogged"),
    "collectives_per_step": ("engine", "loop"),
    "overlap": ("share",),
}
"""Per-rank keys of a run record (issue 37 item 1: what blocks the host, what NCCL launches, the share of gradient
bytes reduced before backward ended) and the parts gpu_check shows."""


def _records(
    runs: list[Run], errors: dict, out: pathlib.Path, kinds=("fp32", "bf16")
) -> list[tuple[Run, dict]]:
    found = []
    for run in runs:
        if run.kind in kinds and not run.peer and not errors.get(run.name):
            record = read_json(run.paths(out)["record"])
            if record is not None and record.get("error") is None:
                found.append((run, record))
    return found


def peaks(runs: list[Run], errors: dict, out: pathlib.Path, *, sampled: bool) -> tuple[list[Check], dict]:
    """Per engine and precision: our estimate of the peak / the measured peak (less the measured "other"), within
    PEAK_GOAL; and the comparison rows, by run name, for the margin's slack and the traffic.

    `sampled` (CPU ranks): the peak is the memory sampler's, which can miss a transient of a few MB (on the tiny
    model 10% of what the estimate covers: 1.09 and 1.12 seen under load), never add one: there the estimate is
    held to at least 1 - PEAK_GOAL of it, and its excess is reported. On CUDA, max_memory_allocated is exact.

    Measured on the runs that write no checkpoint between their steps (fp32: the resumed run; bf16): a
    checkpoint's gather (torch-zero's consolidate_state_dict keeps every rank's state on rank 0) moves the
    "other" a peak is measured against."""
    checks, rows = [], {}
    for run in runs:
        if run.kind not in ("resume", "bf16") or run.peer:
            continue
        name = f"peak vs estimate, {run.precision}"
        record = read_json(run.paths(out)["record"])
        if errors.get(run.name) or record is None or record.get("error"):
            why = errors.get(run.name) or (record or {}).get("error") or "no run record"
            checks.append(failed(name, run.engine, why, limit=f"within {PEAK_GOAL:.0%}"))
            continue
        spec = find_engine(record["engine"])
        if spec is None or spec.peak_model is None:
            checks.append(
                cannot_run(
                    name,
                    run.engine,
                    "the registry gives this engine no peak model",
                    limit=f"within {PEAK_GOAL:.0%}",
                )
            )
            continue
        row = compare_cell(record, model_facts(record["model"], record["num_params"], record.get("lora")))
        rows[run.name] = row
        ratio = row["peak"]["ratio_without_other"]
        if ratio is None:
            checks.append(failed(name, run.engine, "no estimate", limit=f"within {PEAK_GOAL:.0%}"))
        elif sampled:  # the estimate must not fall short; above the sampled peak it may be the sampler's miss
            ok = ratio >= 1 - PEAK_GOAL
            checks.append(
                Check(
                    name=name,
                    engine=run.engine,
                    passed=ok,
                    value=abs(ratio - 1),
                    limit=f"estimate / sampled peak >= {1 - PEAK_GOAL:g}",
                    note=f"estimate / measured = {ratio:.4f} (CPU: a sampled peak can only miss)",
                )
            )
        else:
            checks.append(
                within(name, run.engine, abs(ratio - 1), PEAK_GOAL, note=f"estimate / measured = {ratio:.4f}")
            )
    return checks, rows


REDUCE_TOLERANCE = 0.01
"""Our ZeRO engines' gradient traffic per step against the paper's (2 Psi for ZeRO-1/2, 3 Psi for ZeRO-3): padding
to the ranks' equal slices adds a few elements."""


def traffic(runs: list[Run], rows: dict, *, world_size: int) -> list[Check]:
    """On 2+ ranks, per engine of ours: the bytes its collectives moved per step / the paper's volume (the
    reduce-scatter of gradients and the all-gather of parameters), within REDUCE_TOLERANCE."""
    checks = []
    for run in runs:
        spec = find_engine(run.engine)
        if run.kind != "resume" or spec is None or not spec.ours:
            continue
        name = "reduce-scatter + all-gather bytes vs the paper"
        if world_size < 2:
            checks.append(
                cannot_run(
                    name, run.engine, "one rank: nothing to reduce", limit=f"within {REDUCE_TOLERANCE:.0%}"
                )
            )
            continue
        row = rows.get(run.name)
        ratio = None if row is None else (row.get("comm") or {}).get("ratio")
        checks.append(
            within(
                name,
                run.engine,
                None if ratio is None else abs(ratio - 1),
                REDUCE_TOLERANCE,
                note=f"measured / paper = {ratio:.5f}" if ratio else "no comm record",
            )
        )
    return checks


def margin(
    runs: list[Run], errors: dict, out: pathlib.Path, rows: dict, process_terms: dict | None
) -> list[Check]:
    """The GPU margin's terms measured beside GpuMargin's assumption: the CUDA context and NCCL's buffers (this
    process, `process_terms`), each run's reserved-but-unallocated peak against its allocator slack."""
    assumed = GpuMargin()
    if process_terms is None:
        why = "no CUDA device: the margin is what a GPU holds beyond the allocated tensors"
        return [
            cannot_run(f"GPU margin: {term}", None, why, kind="measure", limit=value)
            for term, value in assumed.terms(world_size=2).items()
        ]
    checks = [
        Check(
            name=f"GPU margin: {term}",
            engine=None,
            passed=process_terms.get(term) is not None,
            value=process_terms.get(term),
            limit=assumed.terms(world_size=process_terms["world_size"])[term],
            kind="measure",
            note="measured in the check's own process (mem_get_info before and after)",
        )
        for term in ("cuda_context", "nccl_buffers")
    ]
    for run, record in _records(runs, errors, out):
        row = rows.get(run.name)
        cuda = max(
            (rank.get("cuda") or {} for rank in record["ranks"]), key=lambda c: c.get("max_reserved_bytes", 0)
        )
        name = f"GPU margin: allocator_slack, {run.precision}"
        if not cuda or row is None or row.get("ours_peak") is None:
            checks.append(cannot_run(name, run.engine, "no CUDA entry or no peak model", kind="measure"))
            continue
        phase = row["ours_peak"]["phases"][row["ours_peak"]["peak_phase"]]
        slack = assumed.terms(world_size=record["world_size"], transient_bytes=transient(phase))[
            "allocator_slack"
        ]
        checks.append(
            measured(
                name,
                run.engine,
                cuda["max_reserved_bytes"] - cuda["max_allocated_bytes"],
                limit=slack,
                note="max reserved - max allocated, beside 50% of the peak's transient terms + 20 MiB",
            )
        )
    return checks


def speed(runs: list[Run], errors: dict, out: pathlib.Path, device_name: str | None) -> list[Check]:
    """Per run: median step time, tokens/s and MFU; docs/bench.md's step-time ratios; the counters when the
    records have them (host syncs, collectives per step, overlap share)."""
    checks, medians = [], {}
    gpu = _gpu_preset(device_name)
    for run, record in _records(runs, errors, out):
        step = record["step_time_s"]["median"]
        medians[(run.engine, run.precision)] = step
        value = dict(step_time_s=step, tokens_per_s=record["tokens_per_s"])
        checks.append(measured(f"step time, {run.precision}", run.engine, value))
        checks.append(_mfu(run, record, gpu))
        checks += _counters(run, record)
    for label, top, bottom, what, target in TARGETS:
        if what != "step":
            continue
        for precision in ("fp32", "bf16"):
            pair = medians.get((top, precision)), medians.get((bottom, precision))
            if None in pair:
                continue
            ratio = pair[0] / pair[1]
            checks.append(
                measured(
                    f"{label}, {precision}",
                    top,
                    ratio,
                    limit=target,
                    note="docs/bench.md's target; one tiny run is no verdict",
                )
            )
    return checks


def _gpu_preset(device_name: str | None):
    if not device_name:
        return None
    lowered = device_name.lower()
    for key, preset in GPUS.items():
        model = key.split("-")[0]
        if model in lowered and ("pcie" in lowered) == ("pcie" in key):
            return preset
    return None


def _mfu(run: Run, record: dict, gpu) -> Check:
    name = f"MFU, {run.precision}"
    if gpu is None:
        return cannot_run(
            name,
            run.engine,
            "no datasheet peak for this device (CPU ranks, or a GPU without a "
            "preset in zero_train.timing.presets)",
            kind="measure",
        )
    flops = 6 * record["num_params"] * record["tokens_per_s"] / record["world_size"]
    peak = gpu.tflops[run.precision] * 1e12
    return measured(
        name,
        run.engine,
        flops / peak,
        note=f"6 x params x tokens/s per GPU / {gpu.label}'s {gpu.tflops[run.precision]:g} TFLOPS",
    )


def _counters(run: Run, record: dict) -> list[Check]:
    """Host syncs, collectives per step and the overlap share, from the record's ranks (rank 0's shown). Our ZeRO
    engines' own syncs are shown beside issue 37's target of 0 with the code sites that made them (measured, not
    asserted: ZeRO-3's step still reads a flag and the gradient norm on the host, issue 37 item 2)."""
    checks = []
    for key, shown in COUNTERS.items():
        values = [rank.get(key) for rank in record["ranks"] if rank.get(key) is not None]
        name = f"{key.replace('_', ' ')}, {run.precision}"
        if not values:
            why = f"the run record has no {key!r} (issue 37 item 1)"
            checks.append(cannot_run(name, run.engine, why, kind="measure"))
            continue
        value = {part: values[0].get(part) for part in shown}
        sites = (
            ", ".join((values[0].get("sites") or {}).get("engine", {}))
            if key == "host_syncs_per_step"
            else ""
        )
        spec = find_engine(run.engine)
        limit = 0 if key == "host_syncs_per_step" and spec is not None and spec.ours else None
        checks.append(
            measured(name, run.engine, value, limit=limit, note=f"engine syncs at {sites}" if sites else "")
        )
    return checks
