"""What a checkpoint save costs the training loop, with and without --async-save (docs/reliability.md).

    python scripts/measure_save_cost.py --model gpt2-25m --world-size 2 --repeats 3 --save-dir /tmp/save-cost

Runs scripts/train.py's loop on spawned gloo ranks, interleaving three modes per repeat: no checkpoints, saves
every --save-every steps written at once, and the same saves written in the background. For each run it
reports rank 0's loop time (every step plus what runs after it: the saves, except the final one, which both
modes wait for) and how long the save call blocked the loop; the cost of one save is the loop time above the
run without checkpoints, divided by the saves made. Prints one JSON object per run, then min/median/max.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time

from zero_train.runtime.dist import init_distributed
from zero_train.testing import run_ranks
from zero_train.train.args import parse_args
from zero_train.train.loop import Trainer
from zero_train.train.setup import plan_run


def _train(rank: int, world_size: int, argv: list[str]) -> dict:
    args = parse_args(argv)
    trainer = Trainer(args, plan_run(args, world_size=world_size), init_distributed())
    after_step, blocked = trainer._after_step, []

    def timed_after_step(step, writer):  # the saves run here (the final one runs in _finish)
        started = time.perf_counter()
        after_step(step, writer)
        blocked.append(time.perf_counter() - started)

    trainer._after_step = timed_after_step
    trainer.run()
    return dict(loop_s=sum(trainer.step_times) + sum(blocked), blocked_s=sorted(blocked)[-2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-25m")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save-dir", required=True)
    args = parser.parse_args()
    base = ["--engine", "zero1", "--model", args.model, "--max-steps", str(args.steps), "--no-progress",
            "--eval-every", "0", "--eval-batches", "1", "--log-every", str(args.steps)]  # fmt: skip
    modes = {
        "none": base,
        "sync": [*base, "--save-dir", args.save_dir, "--save-every", str(args.save_every)],
        "async": [*base, "--save-dir", args.save_dir, "--save-every", str(args.save_every), "--async-save"],
    }
    saves = (args.steps - 1) // args.save_every
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    for repeat in range(args.repeats):
        for mode, argv in modes.items():  # interleaved, so that load changes hit every mode alike
            shutil.rmtree(args.save_dir, ignore_errors=True)
            result = run_ranks(_train, args.world_size, (argv,), timeout_s=3600)[0]
            results[mode].append(result)
            print(json.dumps(dict(repeat=repeat, mode=mode, **result)), flush=True)
    for mode in ("sync", "async"):
        costs = [
            (r["loop_s"] - n["loop_s"]) / saves for r, n in zip(results[mode], results["none"], strict=True)
        ]
        blocked = [max(r["blocked_s"]) for r in results[mode]]
        print(
            f"{mode}: cost per save {_spread(costs)} s; save call blocked the loop {_spread(blocked)} s",
            flush=True,
        )
    print(f"no checkpoints: loop {_spread([r['loop_s'] for r in results['none']])} s for {args.steps} steps")


def _spread(values: list[float]) -> str:
    return f"min {min(values):.3f} / median {statistics.median(values):.3f} / max {max(values):.3f}"


if __name__ == "__main__":
    main()
