"""The benchmark's engines (one registry), its cells (engine x precision), their order, and a run's flags.

A cell is one engine at one precision. Every engine is a line of ENGINE_REGISTRY: the name in the
tables, the `--engine` of scripts/train.py it runs, the ZeRO stage of the DeepSpeed config generated for
it (profile's generator: zero_train.ds_config), its label, and whether it is the Hugging Face Trainer
peer (scripts/hf_trainer.py, the Trainer with the SAME generated config: hf-ds1 is Trainer + DeepSpeed
ZeRO-1, hf-ddp the Trainer's own DDP). Adding an engine to the benchmark is adding one line there.

Order: repeat k runs each cell that has more than k repeats once; repeat 0 in the given order, later
ones in a seeded shuffle, so that no engine always runs first (cold caches) or right after the same
neighbour, and a burst of machine noise hits one repeat of several engines rather than every repeat of
one engine. The engines the targets compare get `--repeats` runs, the others (ds2, ds3, fsdp2-z2,
fsdp2-z3: table only) `--other-repeats`, so that the whole benchmark fits in minutes.
"""

from __future__ import annotations

import argparse
import pathlib
import random
from dataclasses import dataclass

from zero_train.ds_config.keys import PRECISIONS

TRAIN_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "train.py"
PEER_SCRIPT = TRAIN_SCRIPT.parent / "hf_trainer.py"


@dataclass(frozen=True, slots=True)
class BenchEngine:
    """One engine of the benchmark (a row of its tables)."""

    name: str
    """Table key and file stem part, e.g. "zero1", "hf-ds1"."""
    train_engine: str
    """The `--engine` of scripts/train.py (or of scripts/hf_trainer.py for a peer)."""
    zero_stage: int
    """ZeRO stage of the DeepSpeed config generated for it (0: DDP)."""
    label: str
    """How the tables name it."""
    peer: bool = False
    """True: the Hugging Face Trainer (scripts/hf_trainer.py) trains, not scripts/train.py."""
    default: bool = True
    """In the default `--engines`."""


ENGINE_REGISTRY: dict[str, BenchEngine] = {
    engine.name: engine
    for engine in (
        BenchEngine("ddp", "ddp", 0, "ddp (torch DDP)"),
        BenchEngine("zero1", "zero1", 1, "**zero1 (ours)**"),
        BenchEngine("zero2", "zero2", 2, "**zero2 (ours)**"),
        BenchEngine("torch-zero", "torch-zero", 1, "torch-zero (ZeroRedundancyOptimizer)"),
        BenchEngine("ds1", "deepspeed", 1, "ds1 (DeepSpeed ZeRO-1)"),
        BenchEngine("ds2", "deepspeed", 2, "ds2 (DeepSpeed ZeRO-2)"),
        BenchEngine("ds3", "deepspeed", 3, "ds3 (DeepSpeed ZeRO-3)"),
        BenchEngine("fsdp2-z2", "fsdp2", 2, "fsdp2-z2 (torch FSDP2, kept gathered)"),
        BenchEngine("fsdp2-z3", "fsdp2", 3, "fsdp2-z3 (torch FSDP2, resharded)"),
        BenchEngine("hf-ddp", "ddp", 0, "hf-ddp (HF Trainer, its DDP)", peer=True, default=False),
        BenchEngine("hf-ds1", "deepspeed", 1, "hf-ds1 (HF Trainer + DeepSpeed ZeRO-1)", peer=True),
        BenchEngine(
            "hf-ds2", "deepspeed", 2, "hf-ds2 (HF Trainer + DeepSpeed ZeRO-2)", peer=True, default=False
        ),
        BenchEngine(
            "hf-ds3", "deepspeed", 3, "hf-ds3 (HF Trainer + DeepSpeed ZeRO-3)", peer=True, default=False
        ),
    )
}
BENCH_ENGINES = tuple(ENGINE_REGISTRY)
DEFAULT_ENGINES = tuple(name for name, engine in ENGINE_REGISTRY.items() if engine.default)
# of ds_config.keys.PRECISIONS: DeepSpeed runs fp16 on a CPU only where oneDNN has fp16 kernels (AVX512-FP16)
BENCH_PRECISIONS = tuple(p for p in PRECISIONS if p != "fp16")


@dataclass(frozen=True, slots=True)
class Cell:
    """One engine at one precision."""

    engine: str
    """A name in ENGINE_REGISTRY."""
    precision: str
    """"fp32" | "bf16"."""

    @property
    def name(self) -> str:
        """File stem and table key, e.g. `zero1-bf16`."""
        return f"{self.engine}-{self.precision}"

    @property
    def spec(self) -> BenchEngine:
        """The engine's registry entry."""
        return ENGINE_REGISTRY[self.engine]

    @property
    def is_peer(self) -> bool:
        """True for the Hugging Face Trainer cells."""
        return self.spec.peer

    @property
    def zero_stage(self) -> int:
        """ZeRO stage of the cell's config (0: DDP)."""
        return self.spec.zero_stage


def interleaved(cells: list[Cell], repeats: list[int]) -> list[tuple[int, Cell]]:
    """(repeat, cell) in run order: repeat k runs every cell with more than k repeats, repeat 0 in the
    given order, each later repeat in a shuffle seeded by k.

    Args:
        cells: the cells, in table order.
        repeats: runs of each cell (same order).
    """
    order = []
    for repeat in range(max(repeats, default=0)):
        chosen = [cell for cell, count in zip(cells, repeats, strict=True) if count > repeat]
        if repeat:
            random.Random(repeat).shuffle(chosen)
        order += [(repeat, cell) for cell in chosen]
    return order


def cell_run_config(cell: Cell, args: argparse.Namespace, hidden_size: int | None) -> dict:
    """The DeepSpeed config of the cell (profile's generator: every engine and the peer read the same)."""
    from zero_train.ds_config.generate import ConfigRequest, generate_config

    request = ConfigRequest(
        stage=cell.zero_stage,
        precision=cell.precision,
        micro_batch_size=args.micro_batch_size,
        grad_accum=1,
        world_size=args.world_size,
        hidden_size=hidden_size,
    )
    return generate_config(request)


def run_script(cell: Cell, args: argparse.Namespace) -> pathlib.Path:
    """The training script of the cell: scripts/train.py (or --train-script), or the Trainer peer's."""
    return PEER_SCRIPT if cell.is_peer else pathlib.Path(args.train_script)


def steps_of(cell: Cell, args: argparse.Namespace) -> tuple[int, int]:
    """(optimizer steps, warm-up steps left out of the median) of the cell's runs: --bf16-steps and
    --bf16-warmup for bf16 cells (fewer where the CPU emulates bf16), --steps and --warmup otherwise."""
    if cell.precision == "bf16":
        return args.bf16_steps, args.bf16_warmup
    return args.steps, args.warmup


def run_argv(cell: Cell, args: argparse.Namespace, paths: dict[str, pathlib.Path]) -> list[str]:
    """The training script's flags for one run (the same under any launcher and in one-launch mode).

    Args:
        cell: the cell.
        args: the bench flags.
        paths: "config", "record", "metrics" of this run.
    """
    argv = [
        "--deepspeed_config", str(paths["config"]),
        "--engine", cell.spec.train_engine,
        "--model", args.model,
        "--block-size", str(args.block_size),
        "--micro-batch-size", str(args.micro_batch_size),
        "--grad-accum", "1",
        "--max-steps", str(steps_of(cell, args)[0]),
        "--memory-report", str(paths["record"]),
        "--metrics-file", str(paths["metrics"]),
        "--no-progress",
    ]  # fmt: skip
    if args.dataset:
        argv += ["--dataset", args.dataset]
    return argv if cell.is_peer else argv + ["--eval-batches", "1"]  # the peer does not evaluate


def launcher_prefix(args: argparse.Namespace, port: int) -> list[str]:
    """`torchrun --nproc_per_node N --master_port P` (or DeepSpeed's launcher)."""
    from zero_train.launch.launcher import launcher_path

    ranks_flag = "--num_gpus" if args.launcher == "deepspeed" else "--nproc_per_node"
    return [launcher_path(args.launcher), ranks_flag, str(args.world_size), "--master_port", str(port)]


def run_command(cell: Cell, args: argparse.Namespace, paths: dict[str, pathlib.Path], port: int) -> list[str]:
    """The launcher command of one run in its own launch (--launch per-cell)."""
    return [*launcher_prefix(args, port), str(run_script(cell, args)), *run_argv(cell, args, paths)]
