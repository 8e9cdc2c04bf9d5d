"""A host-work fit judged on the stored runs' cells before a design commits to it: each stored run's held-out
cells predicted from a fit on every other stored run's cells (both roles) and that run's own calibration cells,
as a design that had not seen the run would fit, and judged as scripts/steptime_check.py judges (within 25%,
median |error|, pairs more than 15% apart ordered right).

    .venv/bin/python scripts/steptime_crossval.py --fit v6                    # v6's fit (steptime_designs.FIT_OF)
    .venv/bin/python scripts/steptime_crossval.py --fit v6 --shared per_logit_s,per_ckpt_layer_s,per_sync_s

Only cells whose verdicts are published (docs/steptime-quiet/seen/) are used: this is how a design is chosen.
`--leave-out model` also leaves out of each held-out set's fit every other run's held-out cells of its model, as
a design's new held-out shapes are (docs/steptime.md, after v13's run); each line's `small` is the cells
measured under 0.07 s: their signed median error.
"""

from __future__ import annotations

import argparse
import json
import statistics

from steptime_check import SEEN, _seen_rows
from steptime_designs import DESIGNS, FIT_OF


def crossval(
    terms: tuple[str, ...],
    shared: tuple[str, ...],
    relative: bool,
    runs: list[str],
    speed: bool = False,
    own: int = 1,
    scale: bool | str = False,
    leave_out: str = "run",
) -> dict:
    """Per stored run: its held-out cells' errors, pairs and the fitted shared values. speed: every other run's
    cells rescaled to this run's speed (host_work.speed_scale on the calibration cells both measured); own: this
    run's calibration cells counted this many times; scale: every step x this run's calibration cells' measured
    / predicted (host_work.run_scale); "nearest": x those of the cell's nearest calibration shape and ranks
    (host_work.nearest_rows, design v13); leave_out "model": each held-out set fitted without every other run's
    held-out cells of its model."""
    from zero_train.timing.host_work import (
        at_speed,
        fit_host_work,
        speed_scale,
        with_host_work,
    )
    from zero_train.timing.machine import load_machine

    rows_of = {run: _seen_rows(run) for run in runs}
    model_of = {(run, s["name"]): s["model"] for run in runs for s in DESIGNS[_design(run)][0]}
    results = {}
    for run in runs:
        mine = [row for row in rows_of[run] if row["role"] == "calibration"]
        others = []
        for other in (other for other in runs if other != run):
            others += at_speed(rows_of[other], speed_scale(rows_of[other], mine) if speed else 1.0)
        held = [row for row in rows_of[run] if row["role"] == "held-out"]
        groups = (
            [held]
            if leave_out == "run"
            else [[r for r in held if r["set"] == s] for s in {r["set"]: 0 for r in held}]
        )
        cells = []
        for group in groups:
            model = model_of[(run, group[0]["set"])]
            train = mine * own + [r for r in others if leave_out == "run" or r["role"] == "calibration"
                                  or model_of[(r["run"], r["set"])] != model]  # fmt: skip
            fitted = with_host_work(
                load_machine(SEEN / run / "machine.json"), fit_host_work(train, terms, shared, relative)
            )
            cells += [row | dict(predicted_s=_scaled(fitted, mine, row, scale)) for row in group]
        results[run] = dict(cells=cells, pairs=_pairs(cells),
                            shared={t: fitted.engine_host[cells[0]["engine"]].get(t, 0.0) for t in shared})  # fmt: skip
    return results


def _design(run: str) -> str:
    """The design a stored run measured (its cells.json)."""
    return json.loads((SEEN / run / "cells.json").read_text())["design"]


def _scaled(fitted, mine: list[dict], row: dict, scale: bool | str) -> float:
    """The row's step with the fitted host work, x the run's calibration cells' ratio where `scale` (all of them,
    or "nearest": those of the cell's nearest calibration shape and ranks, design v13)."""
    from zero_train.timing.host_work import nearest_rows, row_seconds, run_scale

    if not scale:
        return row_seconds(fitted, row)
    near = nearest_rows(mine, row["num_params"], row["world_size"]) if scale == "nearest" else mine
    return row_seconds(fitted, row) * run_scale(fitted, near)


def _pairs(cells: list[dict]) -> list[bool]:
    """Per pair of one set's engines measured more than 15% apart: whether the prediction orders them right."""
    right = []
    for i, a in enumerate(cells):
        for b in cells[i + 1 :]:
            measured = (a["measured_s"], b["measured_s"])
            if a["set"] == b["set"] and max(measured) / min(measured) > 1.15:
                right.append((a["measured_s"] > b["measured_s"]) == (a["predicted_s"] > b["predicted_s"]))
    return right


def summary(cells: list[dict], pairs: list[bool]) -> dict:
    errors = [c["predicted_s"] / c["measured_s"] - 1 for c in cells]
    small = [c["predicted_s"] / c["measured_s"] - 1 for c in cells if c["measured_s"] < 0.07]
    return dict(cells=len(errors), median_abs_error=statistics.median(abs(e) for e in errors),
                within_25=sum(abs(e) <= 0.25 for e in errors), pairs=len(pairs), pairs_right=sum(pairs),
                min_error=min(errors), max_error=max(errors), small=len(small),
                small_signed=statistics.median(small) if small else None)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", choices=sorted(FIT_OF), required=True, help="the design whose fit to judge")
    parser.add_argument("--shared", help="these shared terms instead of the design's (comma-separated)")
    parser.add_argument("--terms", help="these per-engine terms instead of the design's (comma-separated)")
    parser.add_argument("--runs", help="the stored runs (default: the design's seen runs, comma-separated)")
    parser.add_argument("--speed", action="store_true", help="other runs' cells rescaled to the run's speed")
    parser.add_argument(
        "--own",
        type=int,
        help="the run's own calibration cells counted this often (default: the design's, or 1)",
    )
    parser.add_argument(
        "--scale",
        choices=("all", "nearest"),
        help="every step x the run's own calibration cells' ratio (nearest: its nearest shape's and ranks')",
    )
    parser.add_argument(
        "--leave-out",
        choices=("run", "model"),
        default="run",
        help="what a held-out set's fit leaves out: its run (default), or also other runs' held-out cells of its model",
    )
    parser.add_argument("--cells", action="store_true", help="print every held-out cell's error")
    args = parser.parse_args()
    how = FIT_OF[args.fit]
    shared = tuple(args.shared.split(",")) if args.shared else how["shared"]
    runs = args.runs.split(",") if args.runs else list(how["seen"])
    speed = args.speed or how.get("speed", False)
    scale = {"all": True, "nearest": "nearest"}.get(args.scale, how.get("scale", False))
    own = args.own or how.get("own", 1)
    terms = tuple(args.terms.split(",")) if args.terms else DESIGNS[args.fit][1]
    results = crossval(terms, shared, how["relative"], runs, speed, own, scale, args.leave_out)
    for run, result in results.items():
        if args.cells:
            for c in result["cells"]:
                error = c["predicted_s"] / c["measured_s"] - 1
                print(
                    f"{run} {c['set']} {c['engine']} {c['measured_s']:.3f} {c['predicted_s']:.3f} {error:+.0%}"
                )
        line = summary(result["cells"], result["pairs"]) | dict(shared=result["shared"])
        print(run, json.dumps(line))
    every = [c for r in results.values() for c in r["cells"]]
    print("all", json.dumps(summary(every, [p for r in results.values() for p in r["pairs"]])))


if __name__ == "__main__":
    main()
