"""One cell of a comparison matrix: an engine at a world size, its generated DeepSpeed config and launcher command.

Shared by `zero-train profile` (a cell per engine x world size) and `zero-train bench` (a cell per engine x
precision, each run several times): both run `scripts/train.py` (or a script taking its flags) under the
deepspeed launcher or torchrun, with a config from zero_train.ds_config's generator.
"""

from __future__ import annotations

import argparse
import pathlib

from zero_train.launch.launcher import launcher_path

# profile engine name -> (scripts/train.py --engine, ZeRO stage of its generated config)
CELL_ENGINES = {
    "ddp": ("ddp", 0),
    "zero1": ("zero1", 1),
    "zero2": ("zero2", 2),
    "torch-zero": ("torch-zero", 1),
    "ds1": ("deepspeed", 1),
    "ds2": ("deepspeed", 2),
    "ds3": ("deepspeed", 3),
    "fsdp2-z2": ("fsdp2", 2),
    "fsdp2-z3": ("fsdp2", 3),
}
TRAIN_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "train.py"


def cell_name(
    engine: str, world_size: int, precision: str, *, grad_accum: int = 1, checkpointing: bool = False
) -> str:
    """The file stem of one cell, e.g. `ds2-w2-fp32`, `ds2-w2-fp32-ga4-ckpt` (accumulation, checkpointing)."""
    return (
        f"{engine}-w{world_size}-{precision}"
        + (f"-ga{grad_accum}" if grad_accum > 1 else "")
        + ("-ckpt" if checkpointing else "")
    )


def args_cell_name(engine: str, world_size: int, args: argparse.Namespace) -> str:
    """cell_name with the accumulation and checkpointing of `args` (absent: 1 and off)."""
    return cell_name(engine, world_size, args.precision, grad_accum=getattr(args, "grad_accum", 1),
                     checkpointing=getattr(args, "gradient_checkpointing", False))  # fmt: skip


def cell_config(engine: str, world_size: int, args: argparse.Namespace, hidden_size: int | None) -> dict:
    """The DeepSpeed config of one cell, from zero_train.ds_config's generator."""
    from zero_train.ds_config.generate import ConfigRequest, generate_config  # here: keeps `--help` light

    request = ConfigRequest(
        stage=CELL_ENGINES[engine][1],
        precision=args.precision,
        micro_batch_size=args.micro_batch_size,
        grad_accum=getattr(args, "grad_accum", 1),
        world_size=world_size,
        hidden_size=hidden_size,
    )
    return generate_config(request)


def launch_command(engine: str, world_size: int, config_path, record_path, args, port: int) -> list[str]:
    """The launcher command line of one cell."""
    ranks_flag = "--num_gpus" if args.launcher == "deepspeed" else "--nproc_per_node"
    launcher = [launcher_path(args.launcher), ranks_flag, str(world_size), "--master_port", str(port)]
    train = [
        str(args.train_script),
        "--deepspeed_config", str(config_path),
        "--engine", CELL_ENGINES[engine][0],
        "--model", args.model,
        "--block-size", str(args.block_size),
        "--micro-batch-size", str(args.micro_batch_size),
        "--grad-accum", str(getattr(args, "grad_accum", 1)),
        "--max-steps", str(args.steps),
        "--memory-report", str(record_path),
    ]  # fmt: skip
    if getattr(args, "gradient_checkpointing", False):
        train.append("--gradient-checkpointing")
    if args.dataset:
        train += ["--dataset", args.dataset]
    return launcher + train


def last_error_line(log_text: str) -> str:
    """The line that best says why a run failed: the last `error:` line, else the last non-empty one."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "error:" in line.lower() or line.split(":")[0].endswith(("Error", "Exception")):
            return line
    return lines[-1] if lines else "no output"
