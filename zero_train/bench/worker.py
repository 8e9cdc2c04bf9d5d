"""Many benchmark runs in ONE launch: every rank trains each run's engine in turn, then tears it down.

    torchrun --nproc_per_node 2 -m zero_train.bench.worker --plan runs/bench/plan.json

`zero-train bench` writes the plan (the runs in their interleaved order, each with the flags its own launch
would give the training entry point or the Trainer peer) and starts this once, instead of paying a launch (two
ranks importing torch, transformers and DeepSpeed: docs/startup.md#launching-ranks) for every run. Each run is
the same code path as its own launch: `zero_train.train.loop.run_training` (or the Trainer peer's `run_peer`)
on the parsed flags, from a fresh model built from the same seed, on the same data; it writes the same metrics
JSONL and run record. After it the engine, its optimizer and DeepSpeed's state are released (Trainer.close(),
DeepSpeed's destroy(), accelerate's singletons and the environment variables it set) and every rank measures
what the allocator still holds against the level before the first run:

    runs/C-rK.done.json     rank 0, per finished run: wall_s, every rank's bytes before the first run
                            (baseline) and after this run's teardown

A run that raises stops the launch (the other ranks may be inside a collective): the bench records
it as failed and relaunches the rest of the plan.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable

import torch.distributed as dist

from zero_train.memory import measure
from zero_train.runtime.dist import init_distributed
from zero_train.runtime.errors import run_cli
from zero_train.runtime.startup import collector_paused
from zero_train.train.args import parse_args
from zero_train.train.config import RunConfig

Train = Callable[[RunConfig], None]
"""A run's training function: zero_train.train.loop.run_training or zero_train.bench.hf_peer.run_peer."""


def settled_bytes(device) -> int:
    """Allocator bytes in use once Python's cycles are collected (DeepSpeed's hooks form cycles)."""
    gc.collect()
    gc.collect()
    return measure.allocated_bytes(device)


def preload(runs: list[dict]) -> tuple[Train, Train | None]:
    """Import what the plan's runs import, so that the baseline already holds every module (not the first run):
    each run's model module and engine (zero_train.train.setup.import_run_modules, as its own launch imports
    them, DeepSpeed with a DeepSpeed engine), and the Trainer where a run is a Trainer peer. Only those: the
    ranks of a plan without a peer or a DeepSpeed engine import neither (docs/startup.md#the-bench-workers-imports).

    Returns:
        (run_training, run_peer): how a run trains on our engines, and how the Trainer peer trains it (None
        where no run of the plan is a peer).
    """
    # expensive: the engines, the Trainer, DeepSpeed (seconds), with the collector paused before the baseline
    from zero_train.train.loop import run_training
    from zero_train.train.setup import import_run_modules

    run_peer = None
    for run in runs:
        import_run_modules(parse_args(run["argv"]))
        if run["peer"] and run_peer is None:
            from zero_train.bench.hf_peer import run_peer  # expensive: transformers' Trainer
    return run_training, run_peer


def train_one(run: dict, run_training: Train, run_peer: Train | None) -> None:
    """One run, exactly as its own launch would do it (python -m zero_train.train, or the Trainer peer)."""

    config = parse_args(run["argv"])
    environment = dict(os.environ)
    try:
        (run_peer if run["peer"] else run_training)(config)
    finally:  # the Trainer's accelerate sets ACCELERATE_USE_DEEPSPEED & co.; the next run must not see them
        os.environ.clear()
        os.environ.update(environment)


def gather_bytes(value: int, dist_info) -> list[int]:
    """Every rank's value, by rank (on every rank)."""
    values: list = [None] * dist_info.world_size
    dist.all_gather_object(values, value)
    return values


def run_plan(plan_path: pathlib.Path) -> int:
    """Every run of the plan in order; rank 0 writes each one's done file. Returns 0."""
    plan = json.loads(plan_path.read_text())
    dist_info = init_distributed()
    with collector_paused():  # faster start-up (zero_train.runtime.startup)
        run_training, run_peer = preload(plan["runs"])
    baseline = gather_bytes(settled_bytes(dist_info.device), dist_info)
    for run in plan["runs"]:
        started = time.perf_counter()
        train_one(run, run_training, run_peer)
        wall_s = time.perf_counter() - started
        after = gather_bytes(settled_bytes(dist_info.device), dist_info)
        if dist_info.is_main:
            done = dict(name=run["name"], wall_s=wall_s, baseline_bytes=baseline, after_teardown_bytes=after)
            pathlib.Path(run["done"]).write_text(json.dumps(done) + "\n")
        print(f"bench worker: {run['name']} done in {wall_s:.1f} s", flush=True)

    dist.destroy_process_group()  # as run_training does for the group a launched run makes
    return 0


def main(argv: list[str] | None = None) -> None:
    """Parse --plan and run it; a user error prints one line and exits 2."""
    parser = argparse.ArgumentParser(
        prog="python -m zero_train.bench.worker", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--plan", required=True, type=pathlib.Path, help="the plan zero-train bench wrote")
    # DeepSpeed's launcher adds --local_rank (LOCAL_RANK holds it too)
    parser.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    run_cli(lambda: run_plan(args.plan))


if __name__ == "__main__":
    main()
