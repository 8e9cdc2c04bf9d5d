"""The benchmark's cells (engine x precision), their interleaved order, and the command line of one run.

A cell is one engine at one precision. Engines are `zero-train profile`'s (ddp, zero1, zero2, torch-zero,
ds1..ds3: scripts/train.py with the config generated for that stage) plus the Hugging Face Trainer
peers `hf-<cell engine>`: scripts/hf_trainer.py, the Trainer with the SAME generated config (hf-ds1:
Trainer + DeepSpeed ZeRO-1; hf-ddp: the Trainer's own DDP). Every run goes through the same launcher and
the same flags; the config generation and the launcher command are profile's own (zero_train.launch.cells).

Order: repeat k runs each cell that has more than k repeats once; repeat 0 in the given order, later
ones in a seeded shuffle, so that no engine always runs first (cold caches) or right after the same
neighbour, and a burst of machine noise hits one repeat of several engines rather than every repeat of
one engine. The engines the targets compare get `--repeats` runs, the others (ds2, ds3: table only)
`--other-repeats`, so that the whole benchmark fits in minutes.
"""

from __future__ import annotations

import argparse
import pathlib
import random
from dataclasses import dataclass

from zero_train.ds_config.keys import PRECISIONS
from zero_train.launch.cells import CELL_ENGINES, TRAIN_SCRIPT, cell_config, launch_command

PEER_PREFIX = "hf-"
PEER_SCRIPT = TRAIN_SCRIPT.parent / "hf_trainer.py"
PEER_ENGINES = tuple(PEER_PREFIX + name for name in ("ddp", "ds1", "ds2", "ds3"))
BENCH_ENGINES = (*CELL_ENGINES, *PEER_ENGINES)
DEFAULT_ENGINES = ("ddp", "zero1", "zero2", "torch-zero", "ds1", "ds2", "ds3", "hf-ds1")
# of ds_config.keys.PRECISIONS: DeepSpeed runs fp16 on a CPU only where oneDNN has fp16 kernels (AVX512-FP16)
BENCH_PRECISIONS = tuple(p for p in PRECISIONS if p != "fp16")


@dataclass(frozen=True, slots=True)
class Cell:
    """One engine at one precision."""

    engine: str
    """A name in BENCH_ENGINES."""
    precision: str
    """"fp32" | "bf16"."""

    @property
    def name(self) -> str:
        """File stem and table key, e.g. `zero1-bf16`."""
        return f"{self.engine}-{self.precision}"

    @property
    def is_peer(self) -> bool:
        """True for the Hugging Face Trainer cells."""
        return self.engine.startswith(PEER_PREFIX)

    @property
    def config_engine(self) -> str:
        """The profile engine whose generated config (and scripts/train.py --engine) this cell uses."""
        return self.engine.removeprefix(PEER_PREFIX)

    @property
    def zero_stage(self) -> int:
        """ZeRO stage of the cell's config (0: DDP)."""
        return CELL_ENGINES[self.config_engine][1]


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


def profile_namespace(cell: Cell, args: argparse.Namespace) -> argparse.Namespace:
    """The flags zero_train.launch.cells' config generator and launcher command expect, for this cell."""
    return argparse.Namespace(
        precision=cell.precision,
        micro_batch_size=args.micro_batch_size,
        launcher=args.launcher,
        train_script=str(PEER_SCRIPT if cell.is_peer else args.train_script),
        model=args.model,
        block_size=args.block_size,
        steps=args.steps,
        dataset=args.dataset,
    )


def cell_run_config(cell: Cell, args: argparse.Namespace, hidden_size: int | None) -> dict:
    """The DeepSpeed config of the cell (profile's generator: every engine and the peer read the same)."""
    return cell_config(cell.config_engine, args.world_size, profile_namespace(cell, args), hidden_size)


def run_command(cell: Cell, args: argparse.Namespace, paths: dict[str, pathlib.Path], port: int) -> list[str]:
    """The launcher command of one run: profile's, plus the per-step metrics file (and a short final eval).

    Args:
        cell: the cell.
        args: the bench flags.
        paths: "config", "record", "metrics" of this run.
        port: a free master port.
    """
    namespace = profile_namespace(cell, args)
    command = launch_command(
        cell.config_engine, args.world_size, paths["config"], paths["record"], namespace, port
    )
    command += ["--metrics-file", str(paths["metrics"]), "--no-progress"]
    return command if cell.is_peer else command + ["--eval-batches", "1"]  # the peer does not evaluate
