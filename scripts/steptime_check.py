"""The step-time model out of sample on this machine: calibrate, fit each engine's host work on calibration
cells, then predict bench cells neither ever saw.

    .venv/bin/python scripts/steptime_check.py run --role all --out runs/steptime   # calibrate + all sets (v14: ~17 min)
    .venv/bin/python scripts/steptime_check.py report --out runs/steptime           # fit, predict, judge

The design, fixed before its run measured anything (issue 39 item 4; DESIGNS: v1 ran first, v2 after v1's
verdict, v3 after v2's quiet run and the model changes it led to, v4 after v3's, v5 after v4's, v6 after v5's,
v7 after v6's, v8 after v7's, v9 after v8's, v10 after v9's, v11 after v10's, v12 after v11's, v13 after v12's,
v14 after v13's, v15 (v14 replicated on new cells) after v14's, v16 after v15's, v17 and v18 (v17 replicated on
new cells) after v16's, v19 and v20 (v19 replicated) after v18's; each committed before its own run):
- `run` writes OUT/machine.json (zero-train calibrate: microbenchmarks only, no training step) and runs the
  design's sets: CALIBRATION sets (every engine, no checkpointing, no accumulation, both model shapes: gpt2-25m,
  24.8M parameters, and llama-tiny, 0.62M; v1 at 2 ranks, v2 and v3 at 1 and 2) and HELD-OUT sets (other rank
  counts, checkpointing, accumulation; v3: other model shapes, micro-batches and sequence lengths too; v2 and v3
  alternate them with the calibration sets);
- `report` predicts the calibration cells from machine.json, fits each engine's host work on their residuals
  (zero_train.timing.host_work; v1, v3 and v4: per micro-batch + per parameter, v2: + per second of communication;
  v5: + per logit element, per checkpointed layer and per collective call shared by every engine, on relative
  error, with the cells of v3's and v4's runs beside its own (v6: and v5's): `export` stored them in SEEN), writes
  OUT/machine-fitted.json, and predicts the held-out cells from it. Only held-out cells are judged: each within
  25%, median |error| within 10%, every pair of engines of one set whose measured step times differ by more
  than 15% ordered right;
- every set is one `zero-train bench` launch, its engines interleaved, fp32, 5 steps of which the first 2 are
  warm-up (left out of the median; v4: 7 steps, the median of 5; v12: each engine run twice, interleaved, 6 steps
  of which 2 warm-up, the median over its runs of each run's median; v14: each set launched once in each of
  three rounds, each engine once per launch, the median over its launches), the bench's ranks on one thread
  each (its launches' OMP_NUM_THREADS=1: the model is told threads_per_rank=1).
The same benches judge bench's predicted duration (zero_train.bench.duration; scripts/steptime_duration.py): its
two constants fitted on the calibration sets' runs, judged on the held-out sets' wall times (OUT/duration.md).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

from steptime_designs import DESIGNS, FIT_OF, STEPS_OF
from steptime_duration import _bench, _launches, duration_report, record_duration_constants


def _design_name(out: pathlib.Path) -> str:
    """The design OUT was run with (v1 where the run wrote none)."""
    path = out / "design.json"
    return json.loads(path.read_text())["design"] if path.exists() else "v1"


def _design(out: pathlib.Path, terms_of: str | None = None) -> tuple[list[dict], tuple[str, ...]]:
    """The sets and fitted terms of the design OUT was run with; `terms_of`: another design's fitted terms
    instead."""
    sets, terms = DESIGNS[_design_name(out)]
    return sets, DESIGNS[terms_of][1] if terms_of else terms


RUN_TIMEOUT_S = 120
"""A run with no progress for this long is stopped (a hang must not eat the measurement's window)."""


def run(out: pathlib.Path, role: str, names: list[str] | None = None, design: str = "v17") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "design.json").write_text(json.dumps(dict(design=design)) + "\n")
    zero_train = [sys.executable, "-m", "zero_train.cli.main"]
    started = time.time()
    if role in ("calibration", "all") and not names:
        subprocess.run([*zero_train, "calibrate", "--world-sizes", "2,4", "-o", str(out / "machine.json"),
                        "--force"], check=True)  # fmt: skip
        print(f"[{time.time() - started:.0f} s] calibrated", flush=True)
    steps = STEPS_OF[design]
    repeats = str(steps.get("repeats", 1))  # runs per cell, interleaved in the set's launch (v12: 2)
    # v14: every set launched once per round, the rounds in turn, the odd ones in reverse order
    rounds = steps.get("rounds", 1)
    for round_ in range(rounds):
        order = DESIGNS[design][0] if round_ % 2 == 0 else DESIGNS[design][0][::-1]
        for cell_set in order:
            if role not in (cell_set["role"], "all") or (names and cell_set["name"] not in names):
                continue
            folder = out / cell_set["name"] / (f"round-{round_ + 1}" if rounds > 1 else "")
            flags = ["--model", cell_set["model"], "--engines", cell_set["engines"], "--precisions", "fp32",
                     "--world-size", str(cell_set["world_size"]), "--micro-batch-size", str(cell_set["micro_batch_size"]),
                     "--block-size", str(cell_set["block_size"]), "--grad-accum", str(cell_set.get("grad_accum", 1)),
                     "--steps", str(steps["steps"]), "--warmup", str(steps["warmup"]), "--repeats", repeats,
                     "--other-repeats", repeats, "--timeout", str(RUN_TIMEOUT_S), "--out", str(folder)]  # fmt: skip
            flags += ["--gradient-checkpointing"] if cell_set.get("gradient_checkpointing") else []
            subprocess.run([*zero_train, "bench", *flags], check=False)
            print(f"[{time.time() - started:.0f} s] {cell_set['name']} {folder.name} done", flush=True)


def predict(cell_set: dict, engine: str, machine):
    """The model's StepTime of one cell, with the DeepSpeed config the bench generated for it."""
    from zero_train.hf.models import model_config
    from zero_train.launch.cells import cell_config
    from zero_train.memory.model.theory import model_shape
    from zero_train.timing.step import StepSetup, step_time

    config = model_config(cell_set["model"])
    accum, checkpointing = cell_set.get("grad_accum", 1), cell_set.get("gradient_checkpointing", False)
    zero = cell_config(engine, cell_set["world_size"], precision="fp32", micro_batch_size=cell_set["micro_batch_size"],
                       grad_accum=accum, hidden_size=config.hidden_size)["zero_optimization"]  # fmt: skip
    setup = StepSetup(engine=engine, world_size=cell_set["world_size"], gpus_per_node=cell_set["world_size"],
                      micro_batch_size=cell_set["micro_batch_size"], block_size=cell_set["block_size"],
                      grad_accum=accum, gradient_checkpointing=checkpointing, precision="fp32",
                      bucket_elements=int(zero.get("reduce_bucket_size") or 5e8),
                      overlap_comm=zero.get("overlap_comm"), threads_per_rank=1)  # fmt: skip
    return step_time(model_shape(config), _count(cell_set), setup, machine)


_COUNTS: dict = {}


def _count(cell_set: dict):
    """The set's ActivationCount (FLOPs and bytes), counted once per set."""
    import torch

    from zero_train.hf.models import model_config
    from zero_train.memory.model.activations import count_activations

    if cell_set["name"] not in _COUNTS:
        _COUNTS[cell_set["name"]] = count_activations(
            model_config(cell_set["model"]), micro_batch_size=cell_set["micro_batch_size"],
            block_size=cell_set["block_size"], dtype=torch.float32,
            gradient_checkpointing=cell_set.get("gradient_checkpointing", False))  # fmt: skip
    return _COUNTS[cell_set["name"]]


def _measured(folder: pathlib.Path) -> tuple[dict[str, float], tuple]:
    """engine -> median step seconds after the warm-up (v14: the median over the set's launches of each launch's),
    and the load average (the first launch's start, the last's end)."""
    benches = [b for b in (_bench(f) for f, _ in _launches(folder)) if b is not None]
    if not benches:
        return {}, ("not recorded", "not recorded")
    per_launch: dict[str, list[float]] = {}
    for bench in benches:
        for c in (c for c in bench["cells"] if c.get("step_time_s")):
            per_launch.setdefault(c["engine"], []).append(c["step_time_s"]["median"])
    cells = {engine: statistics.median(medians) for engine, medians in per_launch.items()}
    return cells, (benches[0]["load_average"]["start"][0], benches[-1]["load_average"]["end"][0])


def _spread(folder: pathlib.Path) -> dict[str, tuple[float, float]]:
    """engine -> (min, max) of the step seconds its runs' medians were taken over (after each run's warm-up)."""
    steps_of: dict[str, list[float]] = {}
    for launch, _ in _launches(folder):
        for sample in (_bench(launch) or {"samples": []})["samples"]:
            steps = (sample.get("step_times_s") or [])[sample.get("warmup", 0) :]
            if steps and not sample.get("error"):
                steps_of.setdefault(sample["engine"], []).extend(steps)
    return {engine: (min(steps), max(steps)) for engine, steps in steps_of.items()}


def _fit_row(cell_set: dict, engine: str, seconds: float, machine) -> dict:
    """One measured cell as a row of the host-work fit (host_work.fit_host_work's columns)."""
    from zero_train.hf.models import model_config
    from zero_train.memory.model.theory import model_shape

    shape = model_shape(model_config(cell_set["model"]))
    step = predict(cell_set, engine, machine)
    comm_s = sum(value for name, value in step.terms.items() if name.startswith("comm: "))
    calls = sum(entry["calls"] for entry in step.comm.values()) if cell_set["world_size"] > 1 else 0
    return dict(set=cell_set["name"], engine=engine, measured_s=seconds, predicted_s=step.seconds, comm_s=comm_s,
                world_size=cell_set["world_size"], sync_points=step.sync_points,
                residual_s=seconds - step.seconds, grad_accum=cell_set.get("grad_accum", 1),
                num_params=shape.num_params, host_cores=machine.host_cores_per_rank(cell_set["world_size"]),
                logits=cell_set["micro_batch_size"] * cell_set["block_size"] * shape.vocab_size,
                ckpt_layers=shape.num_layers if cell_set.get("gradient_checkpointing") else 0, calls=calls,
                ops=_count(cell_set).ops)  # fmt: skip


SEEN = pathlib.Path(__file__).resolve().parent.parent / "docs" / "steptime-quiet" / "seen"
"""Earlier runs' measured cells (`export`), each with the calibration it ran with: a design's FIT_OF `seen`."""


def _seen_rows(name: str) -> list[dict]:
    """Every cell an earlier run measured (calibration and held-out: its verdict is published), as fit rows
    predicted with that run's own calibration."""
    from zero_train.timing.machine import load_machine

    folder = SEEN / name
    machine = load_machine(folder / "machine.json")
    stored = json.loads((folder / "cells.json").read_text())
    sets = {s["name"]: s for s in DESIGNS[stored["design"]][0]}
    _COUNTS.clear()
    rows = [
        _fit_row(sets[c["set"]], c["engine"], c["measured_s"], machine) | dict(run=name, role=c["role"])
        for c in stored["cells"]
    ]
    _COUNTS.clear()
    return rows


def export(out: pathlib.Path, to: pathlib.Path) -> None:
    """A run's calibration and measured cells (both roles) into `to`, for later designs to fit on."""
    to.mkdir(parents=True, exist_ok=True)
    (to / "machine.json").write_text((out / "machine.json").read_text())
    design = _design_name(out)
    cells = [dict(set=s["name"], role=s["role"], engine=engine, measured_s=seconds)
             for s in DESIGNS[design][0] for engine, seconds in _measured(out / s["name"])[0].items()]  # fmt: skip
    (to / "cells.json").write_text(json.dumps(dict(design=design, cells=cells), indent=1) + "\n")


def fit(
    out: pathlib.Path,
    machine,
    sets: list[dict],
    terms: tuple[str, ...],
    suffix: str = "",
    how: dict | None = None,
):
    """Each engine's host work fitted on the calibration sets' residuals (and, where the design says `seen`,
    on earlier runs' cells too): (fitted machine, calibration rows)."""
    import dataclasses

    from zero_train.timing.host_work import at_speed, fit_host_work, run_scale, speed_scale, with_host_work

    how = how or {}
    rows = []
    for cell_set in [s for s in sets if s["role"] == "calibration"]:
        measured, _ = _measured(out / cell_set["name"])
        rows += [_fit_row(cell_set, engine, seconds, machine) for engine, seconds in measured.items()]
    seen = []  # "speed": each earlier run's cells at this run's speed (host_work.at_speed); "own": rows count
    for name in how.get("seen", ()):
        stored = _seen_rows(name)
        seen += at_speed(stored, speed_scale(stored, rows)) if how.get("speed") else stored
    fits = fit_host_work(
        rows * how.get("own", 1) + seen, terms, how.get("shared", ()), how.get("relative", False)
    )
    fitted = with_host_work(machine, fits)
    if how.get("scale"):  # "scale": every step x the run's own calibration cells' measured / predicted
        fitted = dataclasses.replace(fitted, step_scale=run_scale(fitted, rows))
    (out / f"machine-fitted{suffix}.json").write_text(json.dumps(fitted.as_dict(), indent=1) + "\n")
    return fitted, rows


def report(out: pathlib.Path, terms_of: str | None = None) -> dict:
    import dataclasses

    from zero_train.timing.host_work import TERM, nearest_rows, run_scale
    from zero_train.timing.machine import load_machine

    machine = load_machine(out / "machine.json")
    sets, terms = _design(out, terms_of)
    suffix = f"-terms-{terms_of}" if terms_of else ""
    fitted, calibration = fit(out, machine, sets, terms, suffix, FIT_OF.get(terms_of or _design_name(out)))
    rows, pairs, loads, scales = [], [], [], {}
    for cell_set in [s for s in sets if s["role"] == "held-out"]:
        measured, load_average = _measured(out / cell_set["name"])
        if not measured:
            continue
        spread = _spread(out / cell_set["name"])
        loads.append((cell_set["name"], *load_average))
        scaled = fitted  # v13: the step scale of the calibration cells nearest the set's shape and ranks
        if (FIT_OF.get(terms_of or _design_name(out)) or {}).get("scale") == "nearest":
            near = nearest_rows(calibration, _fit_row(cell_set, "ddp", 1.0, machine)["num_params"],
                                cell_set["world_size"])  # fmt: skip
            scaled = dataclasses.replace(fitted, step_scale=run_scale(fitted, near))
        scales[cell_set["name"]] = scaled.step_scale
        for engine, seconds in measured.items():
            step, bare = predict(cell_set, engine, scaled), predict(cell_set, engine, machine)
            top = max(step.terms, key=lambda name: abs(step.terms[name]))
            low, high = spread.get(engine, (seconds, seconds))
            rows.append(dict(set=cell_set["name"], engine=engine, measured_s=seconds, measured_min_s=low,
                             measured_max_s=high, predicted_s=step.seconds,
                             error=step.seconds / seconds - 1, without_host_s=bare.seconds,
                             error_without_host=bare.seconds / seconds - 1, host_s=step.terms.get(TERM, 0.0),
                             largest_term=top))  # fmt: skip
        by_engine = {row["engine"]: row for row in rows if row["set"] == cell_set["name"]}
        names = sorted(by_engine)
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                a, b = by_engine[first], by_engine[second]
                if max(a["measured_s"], b["measured_s"]) / min(a["measured_s"], b["measured_s"]) > 1.15:
                    right = (a["measured_s"] > b["measured_s"]) == (a["predicted_s"] > b["predicted_s"])
                    pairs.append(dict(set=cell_set["name"], pair=f"{first} / {second}", right=right,
                                      measured=a["measured_s"] / b["measured_s"],
                                      predicted=a["predicted_s"] / b["predicted_s"]))  # fmt: skip
    errors = [row["error"] for row in rows]
    bare = [abs(row["error_without_host"]) for row in rows]
    summary = dict(cells=len(rows), min_error=min(errors, default=None), max_error=max(errors, default=None),
                   median_abs_error=statistics.median(abs(e) for e in errors) if errors else None,
                   max_abs_error=max((abs(e) for e in errors), default=None),
                   within_25=sum(abs(e) <= 0.25 for e in errors),
                   median_abs_error_without_host=statistics.median(bare) if bare else None,
                   pairs=len(pairs), pairs_right=sum(p["right"] for p in pairs), load_average=loads,
                   step_scale=fitted.step_scale, step_scale_of_set=scales,
                   calibration_load=[(s["name"], *_measured(out / s["name"])[1]) for s in sets
                                     if s["role"] == "calibration"])  # fmt: skip
    (out / f"check{suffix}.json").write_text(json.dumps(dict(summary=summary, rows=rows, pairs=pairs,
                                                    calibration=calibration, host_work=fitted.engine_host),
                                               indent=1) + "\n")  # fmt: skip
    lines = ["| set | engine | measured s (min / median / max) | predicted s | error | without host work | host work s "
             "| largest term |", "|---|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    lines += [f"| {r['set']} | {r['engine']} | {r['measured_min_s']:.3f} / **{r['measured_s']:.3f}** / "
              f"{r['measured_max_s']:.3f} | {r['predicted_s']:.3f} | {r['error']:+.0%} | "
              f"{r['error_without_host']:+.0%} | {r['host_s']:.3f} | {r['largest_term']} |" for r in rows]  # fmt: skip
    lines += [
        "",
        "| set | pair (>15% apart) | measured ratio | predicted ratio | order |",
        "|---|---|---:|---:|---|",
    ]
    lines += [f"| {p['set']} | {p['pair']} | {p['measured']:.2f} | {p['predicted']:.2f} | "
              f"{'right' if p['right'] else 'WRONG'} |" for p in pairs]  # fmt: skip
    lines += ["", "| calibration set | engine | measured s | predicted s without host work | residual s |",
              "|---|---|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {r['set']} | {r['engine']} | {r['measured_s']:.3f} | {r['predicted_s']:.3f} | "
              f"{r['residual_s']:+.3f} |" for r in calibration]  # fmt: skip
    lines += ["", "| engine | per micro-batch s | per parameter ns | per second of communication |",
              "|---|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {e} | {f['per_micro_batch_s']:+.4f} | {f['per_param_s'] * 1e9:+.3f} | {f.get('per_comm_s', 0):+.2f} |"
              for e, f in fitted.engine_host.items()]  # fmt: skip
    lines += ["", json.dumps(summary)]
    (out / f"check{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    duration_report(out, sets, _design_name(out))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("run", "report", "export"))
    parser.add_argument("--out", default="runs/steptime")
    parser.add_argument("--role", choices=("calibration", "held-out", "all"),
                        help="run: which sets (all: calibrate, the calibration sets, then the held-out ones)")  # fmt: skip
    parser.add_argument("--sets", help="run: only these sets of the role (comma-separated names)")
    parser.add_argument("--design", choices=sorted(DESIGNS), default="v19", help="run: the design's sets")
    parser.add_argument("--to", help="export: the folder to write OUT's calibration and measured cells to")
    parser.add_argument("--terms", choices=sorted(DESIGNS),
                        help="report: fit another design's host-work terms (writes check-terms-DESIGN.md)")  # fmt: skip
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    if args.action == "run":
        if not args.role:
            parser.error("run needs --role calibration, held-out or all")
        out.mkdir(parents=True, exist_ok=True)
        record_duration_constants(out)
        run(out, args.role, args.sets.split(",") if args.sets else None, args.design)
    elif args.action == "export":
        if not args.to:
            parser.error("export needs --to FOLDER")
        export(out, pathlib.Path(args.to))
    else:
        report(out, args.terms)


if __name__ == "__main__":
    main()
