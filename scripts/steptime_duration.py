"""bench's predicted duration (zero_train.bench.duration) judged on the step-time check's benches: its two
constants fitted on the calibration sets' runs, judged on the held-out sets' wall times (OUT/duration.md).
Called by scripts/steptime_check.py (`report`; `run` records the constants the benches ran with)."""

from __future__ import annotations

import json
import pathlib
import statistics

from steptime_designs import STEPS_OF


def _bench(folder: pathlib.Path) -> dict | None:
    path = folder / "bench.json"
    return json.loads(path.read_text()) if path.exists() else None


def _launches(folder: pathlib.Path) -> list[tuple[pathlib.Path, str]]:
    """A set's launches as (folder, name suffix): its round-K folders where the design launches every set once
    per round (v14), else the set's folder itself."""
    rounds = sorted(folder.glob("round-*"))
    return [(r, f" ({r.name})") for r in rounds] if rounds else [(folder, "")]


def _duration_runs(bench: dict) -> list[dict]:
    """Per finished run of a bench: its wall time, the sum and count of its step times."""
    return [dict(wall_s=s["wall_s"], steps_s=sum(s["step_times_s"]), steps=len(s["step_times_s"]))
            for s in bench["samples"] if not s.get("error") and s.get("step_times_s")]  # fmt: skip


def duration_report(out: pathlib.Path, sets: list[dict], design: str) -> None:
    """bench/duration.py's constants fitted on the calibration sets' runs, judged on the held-out sets' wall times:
    RUN_START_S the median of (run wall - its steps), STEP_SHARE_OF_MATMUL the median of (predicted step at share 1)
    / (measured mean step), LAUNCH_START_S the median of (launch wall - its runs' walls) / the ranks' share of the
    cores; the probe's rate recovered from each bench's own predicted_s and the constants then (whose launch start
    was not stretched by the share before "launch_share" was recorded)."""
    then = json.loads((out / "duration_constants.json").read_text())
    fits, judged = {"start": [], "share": [], "launch": []}, []
    benches = {f"{s['name']}{suffix}": (s, _bench(folder))
               for s in sets for folder, suffix in _launches(out / s["name"])}  # fmt: skip
    for cell_set, bench in benches.values():
        if bench is None or bench.get("predicted_s") is None:
            continue
        runs = _duration_runs(bench)
        planned = len(bench["samples"])
        steps = STEPS_OF[design]["steps"] * planned
        cpus = bench["machine"].get("logical_cpus")
        stretch = max(1.0, cell_set["world_size"] / cpus) if cpus else 1.0  # ranks beyond the cores share them
        launch_then = then["LAUNCH_START_S"] * (stretch if then.get("launch_share") else 1.0)
        step_then = (bench["predicted_s"] - launch_then - planned * then["RUN_START_S"]) / steps
        share_one = then["STEP_SHARE_OF_MATMUL"] * step_then  # the predicted step were the share 1
        bench["_share_one"], bench["_planned"], bench["_stretch"] = share_one, planned, stretch
        if cell_set["role"] == "calibration":
            fits["start"] += [r["wall_s"] - r["steps_s"] for r in runs]
            fits["share"] += [share_one / (r["steps_s"] / r["steps"]) for r in runs]
            fits["launch"].append((bench["wall_s"] - sum(r["wall_s"] for r in runs)) / stretch)
    if not fits["start"]:
        return
    start, share = statistics.median(fits["start"]), statistics.median(fits["share"])
    launch = statistics.median(fits["launch"])
    for name, (cell_set, bench) in benches.items():
        if bench is None or "_share_one" not in bench:
            continue
        predicted = (launch * bench["_stretch"] + bench["_planned"] * start
                     + STEPS_OF[design]["steps"] * bench["_planned"] * bench["_share_one"] / share)  # fmt: skip
        judged.append(dict(set=name, role=cell_set["role"], wall_s=bench["wall_s"], predicted_then_s=bench["predicted_s"],
                           predicted_s=predicted, error=predicted / bench["wall_s"] - 1,
                           load=(bench["load_average"]["start"][0], bench["load_average"]["end"][0])))  # fmt: skip
    held = [j["error"] for j in judged if j["role"] == "held-out"]
    summary = dict(RUN_START_S=start, STEP_SHARE_OF_MATMUL=share, LAUNCH_START_S=launch, held_out=len(held),
                   min_error=min(held, default=None), max_error=max(held, default=None),
                   median_abs_error=statistics.median(abs(e) for e in held) if held else None)  # fmt: skip
    lines = ["| set | role | wall s | predicted s (constants then) | predicted s (fitted) | error | load start/end |",
             "|---|---|---:|---:|---:|---:|---|"]  # fmt: skip
    lines += [f"| {j['set']} | {j['role']} | {j['wall_s']:.0f} | {j['predicted_then_s']:.0f} | {j['predicted_s']:.0f} | "
              f"{j['error']:+.0%} | {j['load'][0]:.1f} / {j['load'][1]:.1f} |" for j in judged]  # fmt: skip
    lines += ["", json.dumps(summary)]
    (out / "duration.md").write_text("\n".join(lines) + "\n")
    (out / "duration.json").write_text(json.dumps(dict(summary=summary, benches=judged), indent=1) + "\n")
    print("\n".join(lines))


def record_duration_constants(out: pathlib.Path) -> None:
    """The duration constants the benches run with (report recovers each bench's probe rate from them)."""
    from zero_train.bench import duration

    names = ("STEP_SHARE_OF_MATMUL", "RUN_START_S", "LAUNCH_START_S")
    record = {n: getattr(duration, n) for n in names} | {"launch_share": True}  # launch start x ranks / cores
    (out / "duration_constants.json").write_text(json.dumps(record) + "\n")
