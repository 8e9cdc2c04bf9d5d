"""The step-time model out of sample on this machine: calibrate, then time bench cells the calibration never saw.

    .venv/bin/python scripts/steptime_check.py run --out runs/steptime       # calibrate + the bench sets (~15 min)
    .venv/bin/python scripts/steptime_check.py report --out runs/steptime    # predictions beside measurements
    .venv/bin/python scripts/steptime_check.py repeat --out runs/again --first runs/steptime   # run to run

`run` writes OUT/machine.json (zero-train calibrate: microbenchmarks only, no training step) and one
`zero-train bench` per set of SETS (one launch each: a world size, a model, checkpointing and accumulation; its
engines interleaved); `report` predicts every cell's step time from the machine JSON (zero_train.timing, with the
DeepSpeed config the bench generated for it) and writes OUT/check.md and OUT/check.json: the error per cell,
the median |error|, and every pair of engines of one set whose measured step times differ by more than 15%,
ordered right or not.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

SETS = [
    dict(name="gpt2-25m-w2", model="gpt2-25m", world_size=2, micro_batch_size=2, block_size=64,
         engines="ddp,zero1,zero2,zero3,torch-zero,ds1,ds2,ds3,fsdp2-z2,fsdp2-z3"),
    dict(name="gpt2-25m-w4", model="gpt2-25m", world_size=4, micro_batch_size=2, block_size=64,
         engines="ddp,zero1,zero3,ds2,fsdp2-z3"),
    dict(name="gpt2-25m-w1", model="gpt2-25m", world_size=1, micro_batch_size=2, block_size=64,
         engines="ddp,zero1,ds1"),
    dict(name="llama-60m-w2-ckpt-accum2", model="llama-60m", world_size=2, micro_batch_size=2, block_size=128,
         grad_accum=2, gradient_checkpointing=True, engines="ddp,zero2,ds3,fsdp2-z2"),
    dict(name="gpt2-25m-w2-ckpt", model="gpt2-25m", world_size=2, micro_batch_size=4, block_size=64,
         gradient_checkpointing=True, engines="zero1,ds2,fsdp2-z3"),
]  # fmt: skip
"""The cells: every engine of ours, DDP, DeepSpeed and FSDP2, two model shapes, 1, 2 and 4 ranks, with and without
checkpointing and accumulation. Sized so that the whole runs in about 15 minutes on 2 cores."""
STEPS = dict(steps=4, warmup=1)


def run(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    zero_train = [sys.executable, "-m", "zero_train.cli.main"]
    started = time.time()
    subprocess.run([*zero_train, "calibrate", "--world-sizes", "2,4", "-o", str(out / "machine.json"), "--force"],
                   check=True)  # fmt: skip
    for cell_set in SETS:
        flags = ["--model", cell_set["model"], "--engines", cell_set["engines"], "--precisions", "fp32",
                 "--world-size", str(cell_set["world_size"]), "--micro-batch-size", str(cell_set["micro_batch_size"]),
                 "--block-size", str(cell_set["block_size"]), "--grad-accum", str(cell_set.get("grad_accum", 1)),
                 "--steps", str(STEPS["steps"]), "--warmup", str(STEPS["warmup"]), "--repeats", "1",
                 "--other-repeats", "1", "--out", str(out / cell_set["name"])]  # fmt: skip
        flags += ["--gradient-checkpointing"] if cell_set.get("gradient_checkpointing") else []
        subprocess.run([*zero_train, "bench", *flags], check=False)
        print(f"[{time.time() - started:.0f} s] {cell_set['name']} done", flush=True)


def predict(cell_set: dict, engine: str, machine) -> float:
    """The model's step time of one cell, with the DeepSpeed config the bench generated for it."""
    import torch

    from zero_train.hf.models import model_config
    from zero_train.launch.cells import cell_config
    from zero_train.memory.model.activations import count_activations
    from zero_train.memory.model.theory import model_shape
    from zero_train.timing.step import StepSetup, step_time

    config = model_config(cell_set["model"])
    accum, checkpointing = cell_set.get("grad_accum", 1), cell_set.get("gradient_checkpointing", False)
    zero = cell_config(engine, cell_set["world_size"], precision="fp32", micro_batch_size=cell_set["micro_batch_size"],
                       grad_accum=accum, hidden_size=config.hidden_size)["zero_optimization"]  # fmt: skip
    count = count_activations(config, micro_batch_size=cell_set["micro_batch_size"], block_size=cell_set["block_size"],
                              dtype=torch.float32, gradient_checkpointing=checkpointing)  # fmt: skip
    setup = StepSetup(engine=engine, world_size=cell_set["world_size"], gpus_per_node=cell_set["world_size"],
                      micro_batch_size=cell_set["micro_batch_size"], block_size=cell_set["block_size"],
                      grad_accum=accum, gradient_checkpointing=checkpointing, precision="fp32",
                      bucket_elements=int(zero.get("reduce_bucket_size") or 5e8),
                      overlap_comm=zero.get("overlap_comm"))  # fmt: skip
    return step_time(model_shape(config), count, setup, machine)


def _measured(folder: pathlib.Path) -> tuple[dict[str, float], tuple]:
    """engine -> median step seconds after the warm-up, and the load average (start, end): from bench.json, or
    from the runs' metrics files where the bench's summary did not get written."""
    path = folder / "bench.json"
    if path.exists():
        bench = json.loads(path.read_text())
        cells = {c["engine"]: c["step_time_s"]["median"] for c in bench["cells"] if c.get("step_time_s")}
        return cells, (bench["load_average"]["start"], bench["load_average"]["end"])
    cells = {}
    for metrics in sorted(folder.glob("runs/*-fp32-r0.jsonl")):
        steps = [
            json.loads(line).get("step_time_s") for line in metrics.read_text().splitlines() if line.strip()
        ]
        steps = [s for s in steps if s is not None][STEPS["warmup"] :]
        if steps:
            cells[metrics.name.removesuffix("-fp32-r0.jsonl")] = statistics.median(steps)
    return cells, ("not recorded", "not recorded")


def report(out: pathlib.Path, machine_path: pathlib.Path | None = None, name: str = "check") -> None:
    from zero_train.timing.machine import load_machine

    machine = load_machine(machine_path or out / "machine.json")
    rows, pairs, loads = [], [], []
    for cell_set in SETS:
        measured, load_average = _measured(out / cell_set["name"])
        if not measured:
            continue
        loads.append((cell_set["name"], *load_average))
        for engine, seconds in measured.items():
            step = predict(cell_set, engine, machine)
            top = max(step.terms, key=lambda name: step.terms[name])
            rows.append(dict(set=cell_set["name"], engine=engine, measured_s=seconds, predicted_s=step.seconds,
                             error=step.seconds / seconds - 1, largest_term=top))  # fmt: skip
        here = [row for row in rows if row["set"] == cell_set["name"]]
        load = statistics.median(row["measured_s"] / row["predicted_s"] for row in here) if here else 1.0
        for row in here:  # the set's common slowdown (the machine's load while it ran) divided out
            row["load_factor"] = load
            row["relative_error"] = row["predicted_s"] * load / row["measured_s"] - 1
        by_engine = {row["engine"]: row for row in here}
        names = sorted(by_engine)
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                a, b = by_engine[first], by_engine[second]
                if max(a["measured_s"], b["measured_s"]) / min(a["measured_s"], b["measured_s"]) > 1.15:
                    right = (a["measured_s"] > b["measured_s"]) == (a["predicted_s"] > b["predicted_s"])
                    pairs.append(dict(set=cell_set["name"], pair=f"{first} / {second}", right=right,
                                      measured=a["measured_s"] / b["measured_s"],
                                      predicted=a["predicted_s"] / b["predicted_s"]))  # fmt: skip
    errors = [abs(row["error"]) for row in rows]
    relative = [abs(row["relative_error"]) for row in rows]
    summary = dict(cells=len(rows), median_abs_error=statistics.median(errors) if errors else None,
                   within_25=sum(e <= 0.25 for e in errors), max_abs_error=max(errors, default=None),
        median_abs_relative_error=statistics.median(relative) if relative else None,
        relative_within_25=sum(e <= 0.25 for e in relative),
                   pairs=len(pairs), pairs_right=sum(p["right"] for p in pairs), load_average=loads)  # fmt: skip
    (out / f"{name}.json").write_text(
        json.dumps(dict(summary=summary, rows=rows, pairs=pairs), indent=1) + "\n"
    )
    lines = [
        "| set | engine | measured s | predicted s | error | set's load factor | error after it | largest term |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {r['set']} | {r['engine']} | {r['measured_s']:.3f} | {r['predicted_s']:.3f} | {r['error']:+.0%} | "
              f"{r['load_factor']:.2f} | {r['relative_error']:+.0%} | {r['largest_term']} |" for r in rows]  # fmt: skip
    lines += [
        "",
        "| set | pair (>15% apart) | measured ratio | predicted ratio | order |",
        "|---|---|---:|---:|---|",
    ]
    lines += [f"| {p['set']} | {p['pair']} | {p['measured']:.2f} | {p['predicted']:.2f} | "
              f"{'right' if p['right'] else 'WRONG'} |" for p in pairs]  # fmt: skip
    lines += ["", json.dumps(summary)]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def repeat(out: pathlib.Path, first: pathlib.Path) -> None:
    """Each cell's step time in two runs of the same sets (`first`, then `out`): how much the machine moved."""
    lines = ["| set | engine | first run s | second run s | second / first |", "|---|---|---:|---:|---:|"]
    ratios = []
    for cell_set in SETS:
        before, _ = _measured(first / cell_set["name"])
        after, _ = _measured(out / cell_set["name"])
        for engine in [e for e in before if e in after]:
            ratios.append(after[engine] / before[engine])
            lines.append(f"| {cell_set['name']} | {engine} | {before[engine]:.2f} | {after[engine]:.2f} | "
                         f"{ratios[-1]:.2f} |")  # fmt: skip
    if ratios:
        lines.append(f"\n{len(ratios)} cells, second / first: min {min(ratios):.2f}, median "
                     f"{statistics.median(ratios):.2f}, max {max(ratios):.2f}")  # fmt: skip
    (out / "repeat.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("run", "report", "repeat"))
    parser.add_argument("--out", default="runs/steptime")
    parser.add_argument("--machine", help="report: another calibration JSON than OUT/machine.json")
    parser.add_argument("--name", default="check", help="report: OUT/NAME.md and OUT/NAME.json")
    parser.add_argument("--first", help="repeat: the OUT of an earlier run of the same sets")
    args = parser.parse_args()
    if args.action == "run":
        run(pathlib.Path(args.out))
    elif args.action == "repeat":
        repeat(pathlib.Path(args.out), pathlib.Path(args.first))
    else:
        report(pathlib.Path(args.out), pathlib.Path(args.machine) if args.machine else None, args.name)


if __name__ == "__main__":
    main()
