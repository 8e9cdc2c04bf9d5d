"""`zero-train profile`: the memory comparison matrix, one real training run per (engine, world size).

zero-train profile --model tiny --world-sizes 1,2 --engines ddp,zero1,torch-zero,ds1,ds2,ds3 --out runs/profile
zero-train report runs/profile                       # report.md, plots, summary.json

Each cell is the training entry point under the deepspeed launcher (`deepspeed --num_gpus N --module
zero_train.train`, or torchrun), with a DeepSpeed config generated for the cell (zero_train.ds_config) and
`--memory-report`:

    DIR/configs/<cell>.json     the generated DeepSpeed config
    DIR/cells/<cell>.json       the run record (schema: zero_train.memory.record), "error" set on failure
    DIR/logs/<cell>.log         the launcher's stdout + stderr

A failing cell is recorded with its error (the last error line of its log) and the matrix continues.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from zero_train.cli.commands import COMMANDS
from zero_train.cli.lora_flags import add_lora_flags, lora_spec
from zero_train.ds_config import write_config
from zero_train.ds_config.keys import PRECISIONS
from zero_train.launch.cells import cell_config, cell_name, last_error_line
from zero_train.launch.command import RANK_LAUNCHERS, Launch, check_launcher, launch_command
from zero_train.memory.record import error_record, load_record, write_record
from zero_train.registry import engine_names, engine_spec
from zero_train.runtime.defaults import default_for
from zero_train.runtime.device import launched_device_type
from zero_train.runtime.errors import UsageError
from zero_train.runtime.outputs import check_output_dir
from zero_train.runtime.parser import int_list, name_list, positive_float, positive_int
from zero_train.runtime.ports import free_port
from zero_train.train.args import run_argv
from zero_train.train.config import (
    DataConfig,
    EngineConfig,
    LoraConfig,
    ModelConfig,
    OutputConfig,
    RunConfig,
    TrainingConfig,
)


def profile_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `profile` with its flags."""
    parser = subparsers.add_parser(
        "profile",
        help=COMMANDS["profile"],
        description="For every engine and world size, run `python -m zero_train.train` under the launcher "
        "with --memory-report and collect the run records in OUT/cells/ (read them with `zero-train report OUT`).",
    )
    shared = {flag: default_for(flag, "profile") for flag in ("model", "block_size", "micro_batch_size")}
    parser.add_argument(
        "--model", default=shared["model"], help=f"a preset or a local HF folder (default {shared['model']})"
    )
    parser.add_argument("--world-sizes", type=int_list, default=[1, 2], help="comma-separated, e.g. 1,2,4")
    parser.add_argument(
        "--engines",
        type=name_list,
        default=list(engine_names(default_only=True)),
        help=f"comma-separated of {','.join(engine_names())} (default: all but "
        f"{','.join(sorted(set(engine_names()) - set(engine_names(default_only=True))))})",
    )
    parser.add_argument("--precision", choices=PRECISIONS, default=default_for("precision", "profile"))
    parser.add_argument("--steps", type=positive_int, default=3, help="optimizer steps per cell (default 3)")
    parser.add_argument("--micro-batch-size", type=positive_int, default=shared["micro_batch_size"])
    parser.add_argument("--block-size", type=positive_int, default=shared["block_size"])
    parser.add_argument(
        "--grad-accum",
        type=positive_int,
        default=default_for("grad_accum", "profile"),
        help="micro-batches per optimizer step",
    )
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="activation checkpointing in every cell"
    )
    parser.add_argument(
        "--dataset", default=default_for("dataset", "profile"), help="default: the offline corpus"
    )
    add_lora_flags(parser)
    parser.add_argument("--launcher", choices=RANK_LAUNCHERS, default="deepspeed")
    parser.add_argument(
        "--train-script",
        default=None,
        help="a script taking train.py's flags (default: python -m zero_train.train)",
    )
    parser.add_argument(
        "--launch",
        choices=("each", "once"),
        default="each",
        help="each (default): a launch per cell; once: one launch per world size trains its cells in turn (the "
        "ranks start once; each cell's peak is compared with its own 'other')",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=900,
        help="seconds per cell (default 900; --launch once: without a cell finishing)",
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.set_defaults(func=profile_command)
    return parser


def run_cell(engine: str, world_size: int, args: argparse.Namespace, out: pathlib.Path, meta: dict) -> dict:
    """Run one cell in its own launch; return its run record (read from the launcher's report, or an error record).

    Args:
        engine, world_size: the cell.
        args: the parsed profile flags.
        out: the profile directory.
        meta: record fields shared by all cells (model, num_params, hidden_size, precision, ...).
    """
    cell = prepare_cell(engine, world_size, args, out, meta)
    if "record" in cell:
        return cell["record"]
    code = launch_cell(cell["argv"], world_size, args, cell["log"])
    error = None
    if code is None:
        error = f"timed out after {args.timeout:g} s (see {cell['log']})"
    elif code != 0 or not cell["record_path"].exists():
        error = f"exit code {code}: {last_error_line(cell['log'].read_text())}"
    return finish_cell(cell, error, meta)


def prepare_cell(
    engine: str, world_size: int, args: argparse.Namespace, out: pathlib.Path, meta: dict
) -> dict:
    """A cell's paths, config and training flags ({"record": error record} when its config cannot be made)."""
    name = _cell_name(engine, world_size, args)
    config_path, record_path = out / "configs" / f"{name}.json", out / "cells" / f"{name}.json"
    record_path.unlink(missing_ok=True)
    meta = dict(meta)
    hidden_size = meta.pop("hidden_size", None)
    cell_meta = dict(meta, engine=engine, zero_stage=engine_spec(engine).stage, world_size=world_size)
    try:  # keywords from the flags, the shape of sharding.zero3.model's Unit(...) call: another call
        config = cell_config(
            engine,
            world_size,
            precision=args.precision,
            micro_batch_size=args.micro_batch_size,
            grad_accum=args.grad_accum,
            hidden_size=hidden_size,
        )
    except UsageError as err:  # e.g. a precision this stage cannot take: the cell fails, the matrix goes on
        record = error_record(f"config: {err}", **cell_meta)
        write_record(record, record_path)
        return dict(record=record)
    write_config(config, config_path)
    argv = run_argv(cell_run_config(engine, args, config_path, record_path))
    return dict(
        name=name,
        engine=engine,
        argv=argv,
        config=config,
        cell_meta=cell_meta,
        record_path=record_path,
        log=out / "logs" / f"{name}.log",
        done=out / "logs" / f"{name}.done.json",
    )


def finish_cell(cell: dict, error: str | None, meta: dict) -> dict:
    """The cell's run record (or an error record), with the profile's facts, written back."""
    record_path = cell["record_path"]
    if error:
        record = error_record(error, ds_config=cell["config"], **cell["cell_meta"])
    else:
        record = load_record(record_path)
    record["zero_stage"] = engine_spec(cell["engine"]).stage
    adapters = (record.get("lora") or {}).get("adapter_params") or 0
    # the full model (ZeRO-3 ranks see partitions) + LoRA's
    record["num_params"] = meta["num_params"] + adapters
    write_record(record, record_path)
    return record


def run_cells_once(
    engines: list[str], world_size: int, args: argparse.Namespace, out: pathlib.Path, meta: dict
) -> list[dict]:
    """Every engine at one world size in ONE launch (--launch once): the bench's worker trains each cell in turn
    and tears it down (zero_train.bench.worker), so the ranks' start-up is paid once, not once per cell. A cell
    that fails stops the launch; it is recorded with the log's last error line and the rest is launched again."""
    from zero_train.bench.one_launch import WORKER_MODULE
    from zero_train.launch.launcher import run_logged  # runtime.vitals, psutil

    cells = [prepare_cell(engine, world_size, args, out, meta) for engine in engines]
    records = {cell["record"]["engine"]: cell["record"] for cell in cells if "record" in cell}
    pending, launches = [cell for cell in cells if "record" not in cell], 0
    while pending:
        plan_path = out / "configs" / f"plan-w{world_size}-{launches}.json"
        plan_path.write_text(
            json.dumps(
                dict(
                    runs=[
                        dict(name=c["name"], peer=False, argv=c["argv"], done=str(c["done"])) for c in pending
                    ]
                ),
                indent=1,
            )
        )
        for cell in pending:
            cell["done"].unlink(missing_ok=True)
        launch = Launch(launcher=args.launcher, nproc_per_node=world_size, master_port=free_port())
        log = out / "logs" / f"launch-w{world_size}-{launches}.log"
        code = run_logged(
            launch_command(launch, ["--plan", str(plan_path)], module=WORKER_MODULE),
            log,
            timeout=args.timeout,
            done_files=[c["done"] for c in pending],
        )
        launches += 1
        for cell in [c for c in pending if c["done"].exists()]:
            records[cell["engine"]] = finish_cell(cell, None, meta)
        pending = [c for c in pending if not c["done"].exists()]
        if pending:
            failed = pending.pop(0)
            why = f"no progress for {args.timeout:g} s" if code is None else f"exit code {code}"
            records[failed["engine"]] = finish_cell(
                failed, f"{why}: {last_error_line(log.read_text())}", meta
            )
    return [records[engine] for engine in engines]


def launch_cell(
    argv: list[str], world_size: int, args: argparse.Namespace, log_path: pathlib.Path
) -> int | None:
    """Train one cell under the launcher (`world_size` ranks of the train script with `argv`), its console in
    `log_path`; return the exit code, None on a timeout. (tests/report/test_report.py swaps this for ranks
    forked from its preloaded forkserver: the same argv, the same record; the launcher itself is tested apart.)"""
    from zero_train.launch.launcher import run_logged  # runtime.vitals, psutil

    launch = Launch(launcher=args.launcher, nproc_per_node=world_size, master_port=free_port())
    command = launch_command(launch, argv, script=args.train_script)
    return run_logged(command, log_path, timeout=args.timeout)


def _cell_name(engine: str, world_size: int, args: argparse.Namespace) -> str:
    return cell_name(
        engine,
        world_size,
        args.precision,
        grad_accum=args.grad_accum,
        checkpointing=args.gradient_checkpointing,
    ) + (f"-lora{args.lora_r}" if args.lora_r else "")


def cell_run_config(engine: str, args: argparse.Namespace, config_path, record_path) -> RunConfig:
    """The training run of one cell: the profile's model, data and batch, the cell's engine and DeepSpeed config,
    and its run record."""
    return RunConfig(
        model=ModelConfig(model=args.model, gradient_checkpointing=args.gradient_checkpointing),
        lora=LoraConfig(r=args.lora_r, target_modules=args.lora_target_modules),
        data=DataConfig(dataset=args.dataset, block_size=args.block_size),
        training=TrainingConfig(
            max_steps=args.steps, micro_batch_size=args.micro_batch_size, grad_accum=args.grad_accum
        ),
        engine=EngineConfig(engine=engine, deepspeed_config=str(config_path)),
        output=OutputConfig(memory_report=str(record_path)),
    )


def _check_args(args: argparse.Namespace) -> None:
    check_output_dir(args.out, flag="--out")  # before any cell runs
    lora_spec(args)  # --lora-target-modules without --lora-r: one line, before any cell
    unknown = [name for name in args.engines if name not in engine_names()]
    if unknown:
        raise UsageError(f"unknown engine(s) {', '.join(unknown)}; choose from {', '.join(engine_names())}")
    if args.train_script is not None and not pathlib.Path(args.train_script).exists():
        raise UsageError(
            f"--train-script {args.train_script} is missing; give an existing script, or none (python -m zero_train.train)"
        )
    check_launcher(args.launcher)
    if args.launch == "once" and args.train_script is not None:
        raise UsageError("--train-script runs in a launch of its own: use --launch each with it")


def _model_meta(args: argparse.Namespace) -> dict:
    """The fields every cell's record shares (the shape of cli/bench.py's bench_meta, whose record is a bench's:
    steps and repeats, no precision or device)."""
    from zero_train.launch.launcher import model_meta  # torch, transformers

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
    name = cell_name(
        record["engine"],
        record["world_size"],
        record["precision"],
        grad_accum=record.get("grad_accum") or 1,
        checkpointing=bool(record.get("gradient_checkpointing")),
    )
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
    from tqdm import tqdm

    _check_args(args)
    meta = _model_meta(args)
    out = pathlib.Path(args.out)
    for sub in ("configs", "cells", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    cells = [(engine, world_size) for world_size in args.world_sizes for engine in args.engines]
    records = []
    if args.launch == "once":
        for world_size in tqdm(args.world_sizes, desc="profile", unit="launch", file=sys.stderr):
            records += run_cells_once(args.engines, world_size, args, out, meta)
    else:
        progress = tqdm(cells, desc="profile", unit="cell", file=sys.stderr)
        for engine, world_size in progress:
            progress.set_postfix_str(_cell_name(engine, world_size, args))
            records.append(run_cell(engine, world_size, args, out, meta))
    print(f"{len(records)} cells -> {out / 'cells'} (next: zero-train report {out})")
    for record in records:
        print(_summary_line(record))
    return 0 if any(record["error"] is None for record in records) else 1
