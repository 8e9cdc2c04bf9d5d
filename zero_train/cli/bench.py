"""`zero-train bench`: every engine on the same model, data, batch and world size, interleaved, in one go.

    zero-train bench                                   # gpt2-25m, 2 ranks, fp32 + bf16, 3 repeats (ds2/ds3: 1)
    zero-train bench --engines ddp,zero1,ds1 --precisions fp32 --repeats 5 --out runs/bench
    python scripts/bench.py ...                        # the same

Each run is a real training run under the launcher: `python -m zero_train.train` (every engine of
zero_train.registry, each with the config `zero-train profile` generates) or the Hugging Face Trainer peer
(hf-ds1 ...: `python -m zero_train.bench.hf_peer`, the Trainer with the same config), instrumented by --metrics-file (step times) and
--memory-report (peak memory, CommLedger bytes). Writes OUT/bench.json (every sample, per-cell numbers,
target ratios, machine) and OUT/bench.md (the tables), and prints the Markdown.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import time

from zero_train.bench.cells import (
    BENCH_ENGINES,
    BENCH_PRECISIONS,
    DEFAULT_ENGINES,
    Cell,
    interleaved,
    steps_of,
)
from zero_train.bench.targets import TARGET_ENGINES
from zero_train.cli.commands import COMMANDS
from zero_train.launch.command import RANK_LAUNCHERS, check_launcher
from zero_train.registry import ENGINES
from zero_train.runtime.defaults import default_for
from zero_train.runtime.errors import UsageError
from zero_train.runtime.outputs import check_output_dir
from zero_train.runtime.parser import name_list, positive_float, positive_int


def bench_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `bench` with its flags."""
    parser = subparsers.add_parser(
        "bench",
        help=COMMANDS["bench"],
        description="Run every engine (and the HF Trainer peer) on the same model, data, batch and world "
        "size, repeats interleaved; write OUT/bench.json and OUT/bench.md.",
    )
    add_bench_flags(parser)
    parser.set_defaults(func=bench_command)
    return parser


def add_bench_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of `zero-train bench` (also scripts/bench.py's)."""
    add = parser.add_argument
    add("--model", default=None, help=f"a preset or a local HF folder (default {SCENARIO_DEFAULTS['model']})")
    add("--engines", type=name_list, default=None, help=f"of {','.join(BENCH_ENGINES)}")
    add("--precisions", type=name_list, default=list(BENCH_PRECISIONS), help="comma-separated of fp32,bf16")
    add("--repeats", type=positive_int, default=3, help="runs per cell of the engines the targets compare")
    add("--other-repeats", type=positive_int, default=1, help="runs per cell of the others (default 1)")
    add("--steps", type=positive_int, default=None, help="optimizer steps per run (default 6)")
    add("--warmup", type=int, default=None, help="first steps of a run left out of its median (default 2)")
    add(
        "--bf16-steps",
        type=positive_int,
        default=None,
        help=f"optimizer steps of a bf16 run (default --steps; {EMULATED_BF16['steps']} where the CPU emulates bf16)",
    )
    add(
        "--bf16-repeats",
        type=positive_int,
        default=None,
        help=f"at most this many runs per bf16 cell (default --repeats; {EMULATED_BF16['repeats']} where the CPU emulates bf16)",
    )
    add(
        "--bf16-warmup",
        type=int,
        default=None,
        help=f"warm-up steps of a bf16 run (default --warmup; {EMULATED_BF16['warmup']} where the CPU emulates bf16)",
    )
    add("--micro-batch-size", type=positive_int, default=None)
    add("--block-size", type=positive_int, default=None)
    add("--world-size", type=positive_int, default=2)
    add("--grad-accum", type=positive_int, default=None, help="micro-batches per optimizer step (default 1)")
    add(
        "--gradient-checkpointing",
        action="store_true",
        default=None,
        help="activation checkpointing in every run",
    )
    add("--dataset", default=None, help="passed to the training scripts (default: theirs)")
    add(
        "--launcher",
        choices=RANK_LAUNCHERS,
        default="torchrun",
        help="torchrun (default: starts ~4 s faster per run than deepspeed's launcher, same training)",
    )
    add(
        "--launch",
        choices=("once", "per-run", "compare"),
        default="once",
        help="once (default): one launch runs every engine in turn, each torn down before the next; "
        "per-run: a launch per run (~15 s of start-up each); compare: every repeat both ways, back to back, "
        "and whether their ratios agree within the step-to-step noise (docs/bench.md)",
    )
    add(
        "--scenario",
        choices=tuple(SCENARIOS),
        default=None,
        help="optimizer (default): gpt2-25m, 2 x 64 tokens per rank, every engine, 6 steps; compute: gpt2-small's "
        "shape, 8 x 256 tokens per rank, ddp/zero1/ds1, 4 steps (explicit flags win)",
    )
    add("--train-script", default=None, help=argparse.SUPPRESS)  # default: python -m zero_train.train
    add("--timeout", type=positive_float, default=300, help="seconds per run (default 300)")
    add("--out", default="runs/bench", help="output directory (default runs/bench)")


BENCH_SAMPLER_DUTY = 0.1
"""The CPU memory sampler's bound in every bench run, either way of launching (memory.measure.sampler_duty):
unbounded, runs late in one launch step slower than in their own launch
(measured: docs/bench.md#the-memory-samplers-bound)."""

EMULATED_BF16 = dict(steps=2, warmup=1, repeats=1)
"""A bf16 cell where the CPU emulates bf16 (no AVX512-BF16 / AMX): one run of 2 steps, the second measured,
so that the whole bench stays under 10 minutes; the engines' differences sit inside the emulation's noise
anyway (measured: docs/bench.md#emulated-bf16). Memory and bytes on the wire do not depend on it. The
Markdown says so."""

SCENARIO_DEFAULTS = dict(
    model=default_for("model", "bench"),
    engines=list(DEFAULT_ENGINES),
    steps=6,
    warmup=2,
    micro_batch_size=default_for("micro_batch_size", "bench"),
    block_size=default_for("block_size", "bench"),
    grad_accum=1,
    gradient_checkpointing=False,
)
SCENARIOS = {
    "optimizer": {},
    "compute": dict(
        model="gpt2-small",
        engines=[spec.name for spec in ENGINES if spec.bench_compute],
        steps=4,
        warmup=1,
        micro_batch_size=8,
        block_size=256,
    ),
}
"""Named flag sets over SCENARIO_DEFAULTS. optimizer (the default): a small model on few tokens, so that
the optimizer step and the gradient exchange are most of a step; compute: gpt2-small's shape on 8 x 256
tokens per rank, where forward and backward are most of it."""


def resolve_scenario(args: argparse.Namespace) -> None:
    """Fill the flags the user did not give from the scenario (explicit flags win)."""
    values = {**SCENARIO_DEFAULTS, **SCENARIOS[getattr(args, "scenario", None) or "optimizer"]}
    for name, value in values.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    missing = [name for name in EMULATED_BF16 if getattr(args, f"bf16_{name}", None) is None]
    if missing:  # the bf16 flags not given: as the fp32 ones, or few where the CPU emulates bf16
        from zero_train.bench import machine  # torch

        emulated = "bf16" in args.precisions and machine.bf16_emulated_on_cpu()
        for name in missing:
            value = getattr(args, name, 3)  # --steps, --warmup, --repeats (3: its default)
            setattr(args, f"bf16_{name}", min(value, EMULATED_BF16[name]) if emulated else value)


def _check_args(args: argparse.Namespace) -> None:
    unknown = [name for name in args.engines if name not in BENCH_ENGINES]
    if unknown:
        raise UsageError(f"unknown engine(s) {', '.join(unknown)}; choose from {', '.join(BENCH_ENGINES)}")
    bad = [p for p in args.precisions if p not in BENCH_PRECISIONS]
    if bad:
        raise UsageError(f"unknown precision(s) {', '.join(bad)}; choose from {', '.join(BENCH_PRECISIONS)}")
    if not 0 <= args.warmup < args.steps:
        raise UsageError(f"--warmup {args.warmup} must be at least 0 and below --steps {args.steps}")
    if not 0 <= args.bf16_warmup < args.bf16_steps:
        raise UsageError(
            f"--bf16-warmup {args.bf16_warmup} must be at least 0 and below --bf16-steps {args.bf16_steps}"
        )
    check_launcher(args.launcher)
    check_output_dir(args.out, flag="--out")  # before any run


def bench_meta(args: argparse.Namespace) -> dict:
    """What every run shares: model shape, batch, world size, backend, steps."""
    import torch

    from zero_train.launch.launcher import model_meta

    return dict(
        model_meta(args.model, args.block_size),
        world_size=args.world_size,
        micro_batch_size=args.micro_batch_size,
        block_size=args.block_size,
        tokens_per_step=args.micro_batch_size * args.world_size * args.block_size * args.grad_accum,
        grad_accum=args.grad_accum,
        gradient_checkpointing=args.gradient_checkpointing,
        steps=args.steps,
        warmup=args.warmup,
        bf16_steps=args.bf16_steps,
        bf16_repeats=args.bf16_repeats,
        bf16_warmup=args.bf16_warmup,
        repeats=args.repeats,
        other_repeats=args.other_repeats,
        engines=list(args.engines),
        precisions=list(args.precisions),
        launcher=args.launcher,
        launch=getattr(args, "launch", "once"),
        scenario=getattr(args, "scenario", None) or "optimizer",
        backend="nccl" if torch.cuda.is_available() else "gloo",
    )


def summarize(samples: list[dict], meta: dict) -> tuple[list[dict], list[dict]]:
    """(per-cell summaries in table order, target ratios)."""
    from zero_train.bench.summary import cell_summary, target_ratios

    cells = []
    for precision in meta["precisions"]:
        for engine in meta["engines"]:
            cell = Cell(engine, precision)
            mine = [s for s in samples if s["cell"] == cell.name]
            if mine:
                cells.append(cell_summary(mine, stage=cell.zero_stage, meta=meta))
    targets = target_ratios(samples, {c["cell"]: c for c in cells}, meta["precisions"])
    return cells, targets


def _runs_of(cell: Cell, args: argparse.Namespace, target_engines) -> int:
    """Runs of a cell: --repeats for the engines the targets compare, --other-repeats for the rest, at most
    --bf16-repeats in bf16."""
    runs = args.repeats if cell.engine in target_engines else args.other_repeats
    return min(runs, args.bf16_repeats) if cell.precision == "bf16" else runs


def _predicted(meta: dict, order: list, args: argparse.Namespace, launch: str) -> float | None:
    """Say how long the bench will take before it starts (zero_train.bench.duration); the prediction."""
    from zero_train.bench.duration import bench_seconds, duration_line

    if not meta["num_layers"] or not meta["hidden_size"]:
        return None  # a model whose shape we cannot read: no figure rather than a wrong one
    runs = [(cell.precision, steps_of(cell, args)[0]) for _, cell in order]
    launches = {"once": 1, "per-run": len(order), "compare": 2 * len(order)}[launch]
    if launch == "compare":
        runs = runs * 2
    prediction = bench_seconds(meta, runs, launches=launches)
    print(duration_line(prediction, len(order)), file=sys.stderr)
    return round(prediction["total_s"], 1)


def bench_command(args: argparse.Namespace) -> int:
    """Run every (repeat, cell) in interleaved order; write bench.json + bench.md; exit 1 if all runs failed."""
    from tqdm import tqdm

    from zero_train.bench import machine
    from zero_train.bench.markdown import render
    from zero_train.bench.one_launch import run_all
    from zero_train.bench.run import run_one
    from zero_train.memory.measure import SAMPLER_DUTY_ENV

    resolve_scenario(args)
    _check_args(args)
    # every run, in either way of launching, bounds its memory sampler the same: see memory.measure.sampler_duty
    os.environ.setdefault(SAMPLER_DUTY_ENV, str(BENCH_SAMPLER_DUTY))
    meta = bench_meta(args)
    out = pathlib.Path(args.out)
    for sub in ("configs", "runs", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    started, load_start = time.perf_counter(), machine.load_average()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cells = [Cell(engine, precision) for precision in args.precisions for engine in args.engines]
    repeats = [_runs_of(cell, args, TARGET_ENGINES) for cell in cells]
    order = interleaved(cells, repeats)
    launch, check = getattr(args, "launch", "once"), None
    predicted = _predicted(meta, order, args, launch)
    if launch == "once":
        print(f"bench: {len(order)} runs in one launch (logs: {out / 'logs'})", file=sys.stderr)
        samples = run_all(order, args, out, meta["hidden_size"])
    elif launch == "compare":
        from zero_train.bench.compare import launch_check, run_both

        samples, per_run = run_both(order, args, out, meta["hidden_size"])
        per_run_cells, per_run_targets = summarize(per_run, meta)
        check = dict(per_run=dict(cells=per_run_cells, targets=per_run_targets, samples=per_run))
    else:
        samples = []
        progress = tqdm(order, desc="bench", unit="run", file=sys.stderr)
        for repeat, cell in progress:
            progress.set_postfix_str(f"{cell.name} r{repeat}")
            samples.append(run_one(cell, repeat, args, out, meta["hidden_size"]))
    cell_summaries, targets = summarize(samples, meta)
    if check is not None:  # --launch compare: the tables are the one-launch runs', checked against the others
        check.update(launch_check(samples, check["per_run"]["samples"], targets, check["per_run"]["targets"]))
    result = dict(
        schema="zero_train.bench/1",
        meta=meta,
        machine=machine.machine_info(),
        load_average=dict(start=load_start, end=machine.load_average()),
        started=when,
        wall_s=time.perf_counter() - started,
        predicted_s=predicted,
        cells=cell_summaries,
        targets=targets,
        samples=samples,
    )
    if check is not None:
        result["launch_check"] = check
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    markdown = render(result)
    (out / "bench.md").write_text(markdown)
    print(markdown)
    print(f"-> {out / 'bench.json'}, {out / 'bench.md'}")
    return 0 if any(s["error"] is None for s in samples) else 1
