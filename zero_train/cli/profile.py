"""`zero-train profile`: the memory comparison matrix, one real training run per (engine, world size).

zero-train profile --model tiny --world-sizes 1,2 --engines ddp,zero1,torch-zero,ds1,ds2,ds3 --out runs/profile
zero-train report runs/profile                       # report.md, plots, summary.json

Each cell is `scripts/train.py` under the deepspeed launcher (`deepspeed --num_gpus N`, or torchrun),
with a DeepSpeed config generated for the cell (zero_train.ds_config) and `--memory-report`:

    DIR/configs/<cell>.json     the generated DeepSpeed config
    DIR/cells/<cell>.json       the run record (schema: zero_train.memory.record), "error" set on failure
    DIR/logs/<cell>.log         the launcher's stdout + stderr

A failing cell is recorded with its error (the last error line of its log) and the matrix continues.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from zero_train.cli.commands import COMMANDS
from zero_train.ds_config.keys import PRECISIONS
from zero_train.launch.cells import (
    CELL_ENGINES,
    TRAIN_SCRIPT,
    args_cell_name,
    cell_config,
    cell_name,
    last_error_line,
    launch_command,
)
from zero_train.launch.launcher import check_launcher, model_meta, run_logged
from zero_train.runtime.device import launched_device_type
from zero_train.runtime.errors import UsageError
from zero_train.runtime.parser import int_list, name_list, positive_float, positive_int


def profile_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `profile` with its flags."""
    parser = subparsers.add_parser(
        "profile",
        help=COMMANDS["profile"],
        description="For every engine and world size, run scripts/train.py under the launcher with "
        "--memory-report and collect the run records in OUT/cells/ (read them with `zero-train report OUT`).",
    )
    parser.add_argument("--model", required=True, help="a preset (tiny, gpt2-25m, ...) or a local HF folder")
    parser.add_argument("--world-sizes", type=int_list, default=[1, 2], help="comma-separated, e.g. 1,2,4")
    parser.add_argument(
        "--engines",
        type=name_list,
        default=list(CELL_ENGINES),
        help=f"comma-separated of {','.join(CELL_ENGINES)}",
    )
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--steps", type=positive_int, default=3, help="optimizer steps per cell (default 3)")
    parser.add_argument("--micro-batch-size", type=positive_int, default=2)
    parser.add_argument("--block-size", type=positive_int, default=64)
    parser.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches per optimizer step")
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="activation checkpointing in every cell"
    )
    parser.add_argument("--dataset", default=None, help="passed to scripts/train.py (default: its own)")
    parser.add_argument("--launcher", choices=("deepspeed", "torchrun"), default="deepspeed")
    parser.add_argument(
        "--train-script",
        default=str(TRAIN_SCRIPT),
        help="a script taking scripts/train.py's flags (default: it)",
    )
    parser.add_argument("--timeout", type=positive_float, default=900, help="seconds per cell (default 900)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.set_defaults(func=profile_command)
    return parser


def run_cell(engine: str, world_size: int, args: argparse.Namespace, out: pathlib.Path, meta: dict) -> dict:
    """Run one cell; return its run record (read from the launcher's report, or an error record).

    Args:
        engine, world_size: the cell.
        args: the parsed profile flags.
        out: the profile directory.
        meta: record fields shared by all cells (model, num_params, hidden_size, precision, ...).
    """
    # here, not at the top: keeps `zero-train --help` light (tests/test_layout.py); the subcommand loads it when it runs
    from zero_train.ds_config import write_config
    from zero_train.memory.record import error_record, load_record, write_record
    from zero_train.runtime.ports import free_port

    name = args_cell_name(engine, world_size, args)
    config_path, record_path = out / "configs" / f"{name}.json", out / "cells" / f"{name}.json"
    log_path = out / "logs" / f"{name}.log"
    record_path.unlink(missing_ok=True)
    meta = dict(meta)
    hidden_size = meta.pop("hidden_size", None)
    cell_meta = dict(meta, engine=engine, zero_stage=CELL_ENGINES[engine][1], world_size=world_size)
    try:
        config = cell_config(engine, world_size, args, hidden_size)
    except UsageError as err:  # e.g. a precision this stage cannot take: the cell fails, the matrix goes on
        record = error_record(f"config: {err}", **cell_meta)
        write_record(record, record_path)
        return record
    write_config(config, config_path)
    command = launch_command(engine, world_size, config_path, record_path, args, free_port())
    code = run_logged(command, log_path, timeout=args.timeout)
    error = None
    if code is None:
        error = f"timed out after {args.timeout:g} s (see {log_path})"
    elif code != 0 or not record_path.exists():
        error = f"exit code {code}: {last_error_line(log_path.read_text())}"
    record = error_record(error, ds_config=config, **cell_meta) if error else load_record(record_path)
    record["engine"] = engine  # the launcher knows "deepspeed"; the matrix names the stage
    record["zero_stage"] = CELL_ENGINES[engine][1]
    record["num_params"] = meta["num_params"]  # counted on the full model (ZeRO-3 ranks see partitions)
    write_record(record, record_path)
    return record


def _check_args(args: argparse.Namespace) -> None:
    # here, not at the top: keeps `zero-train --help` light (tests/test_layout.py); the subcommand loads it when it runs
    from zero_train.runtime.outputs import check_output_dir

    check_output_dir(args.out, flag="--out")  # before any cell runs
    unknown = [name for name in args.engines if name not in CELL_ENGINES]
    if unknown:
        raise UsageError(f"unknown engine(s) {', '.join(unknown)}; choose from {', '.join(CELL_ENGINES)}")
    if not pathlib.Path(args.train_script).exists():
        raise UsageError(
            f"{args.train_script} is missing; run profile from a zero_train checkout or give --train-script"
        )
    check_launcher(args.launcher)


def _model_meta(args: argparse.Namespace) -> dict:
    return dict(
        model_meta(args.model, args.block_size),
        precision=args.precision,
        micro_batch_size=args.micro_batch_size,
        grad_accum=args.grad_accum,
        gradient_checkpointing=args.gradient_checkpointing,
        block_size=args.block_size,
        device=launched_device_type(),  # error records too: a failed cell on a GPU node says cuda
    )


def _summary_line(record: dict) -> str:
    name = cell_name(record["engine"], record["world_size"], record["precision"],
                     grad_accum=record.get("grad_accum") or 1,
                     checkpointing=bool(record.get("gradient_checkpointing")))  # fmt: skip
    if record["error"]:
        return f"  {name:<24} FAILED  {record['error']}"
    rank0 = record["ranks"][0]
    categories = rank0["categories"]
    states = sum(categories[c] for c in ("params", "grads", "master_params", "optimizer_states"))
    per_param = states / record["num_params"] if record["num_params"] else float("nan")
    return (
        f"  {name:<24} ok      model states {per_param:5.2f} bytes/param, "
        f"rank-0 peak {rank0['peak_bytes'] / 1e6:8.1f} MB"
    )


def profile_command(args: argparse.Namespace) -> int:
    """Run every cell with a progress bar; print one line per cell; exit 1 only if every cell failed."""
    # here, not at the top: keeps `zero-train --help` light (tests/test_layout.py); the subcommand loads it when it runs
    from tqdm import tqdm

    _check_args(args)
    meta = _model_meta(args)
    out = pathlib.Path(args.out)
    for sub in ("configs", "cells", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    cells = [(engine, world_size) for world_size in args.world_sizes for engine in args.engines]
    records = []
    progress = tqdm(cells, desc="profile", unit="cell", file=sys.stderr)
    for engine, world_size in progress:
        progress.set_postfix_str(args_cell_name(engine, world_size, args))
        records.append(run_cell(engine, world_size, args, out, meta))
    print(f"{len(records)} cells -> {out / 'cells'} (next: zero-train report {out})")
    for record in records:
        print(_summary_line(record))
    return 0 if any(record["error"] is None for record in records) else 1
