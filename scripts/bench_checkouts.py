"""Before/after timing of two checkouts of this repository: `zero-train bench` run in each, alternately.

    git worktree add /tmp/zs-before 4066fce
    python scripts/bench_checkouts.py --before /tmp/zs-before --after . --repeats 3 --out runs/bench-checkouts \
        -- --engines ddp,zero1,zero2 --precisions fp32
    python scripts/bench_checkouts.py --before /tmp/zs-before --after . --repeats 2 --out runs/bench-checkouts-compute \
        -- --scenario compute --engines zero1,zero2 --precisions fp32 --steps 3 --warmup 1

Repeat k runs one `zero-train bench --repeats 1` (the flags after --) in each checkout, the order alternating
with k, so that load on a shared machine hits both sides. Each run's code is its checkout's (PYTHONPATH).
Prints, per engine, after / before of the median step time paired by repeat: min / median / max; writes
OUT/checkouts.json with every bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys


def _bench(checkout: pathlib.Path, out: pathlib.Path, bench_flags: list[str]) -> dict:
    """One `zero-train bench --repeats 1` with `checkout`'s code; its bench.json."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, "-m", "zero_train.cli.main", "bench", "--repeats", "1", "--other-repeats", "1"]
    subprocess.run([*command, *bench_flags, "--out", str(out)], cwd=checkout, env=env, check=True)
    return json.loads((out / "bench.json").read_text())


def _median_steps(result: dict) -> dict[str, float]:
    return {s["engine"]: s["median_step_s"] for s in result["samples"] if s["error"] is None}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=pathlib.Path, required=True, help="the older checkout")
    parser.add_argument("--after", type=pathlib.Path, required=True, help="the newer checkout")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("bench_flags", nargs=argparse.REMAINDER, help="-- then zero-train bench's flags")
    args = parser.parse_args(argv)
    flags = [f for f in args.bench_flags if f != "--"]
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for repeat in range(args.repeats):
        order = ("before", "after") if repeat % 2 == 0 else ("after", "before")
        for side in order:
            out = (args.out / f"{side}-{repeat}").resolve()
            runs[side].append(_bench(sides[side], out, flags))
    ratios = {}
    for engine in _median_steps(runs["after"][0]):
        paired = [
            _median_steps(after)[engine] / _median_steps(before)[engine]
            for before, after in zip(runs["before"], runs["after"], strict=True)
        ]
        ratios[engine] = dict(
            min=min(paired), median=statistics.median(paired), max=max(paired), paired=paired
        )
        print(
            f"{engine}: after / before step time {min(paired):.3f} / {statistics.median(paired):.3f} / {max(paired):.3f}"
        )
    (args.out / "checkouts.json").write_text(json.dumps(dict(sides={k: str(v) for k, v in sides.items()},
                                                             ratios=ratios, runs=runs), indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
