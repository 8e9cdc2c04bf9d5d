"""The benchmark's engines (one registry), its cells (engine x precision), their order, and a run's flags.

A cell is one engine at one precision. The benchmark's engines are zero_train.registry's, each run by
`python -m zero_train.train` with the DeepSpeed config generated for its stage (profile's generator:
zero_train.ds_config), plus a Hugging Face Trainer peer `hf-NAME` for every engine the registry marks `hf_peer`
(zero_train.bench.hf_peer, the Trainer with the SAME generated config: hf-ds1 is Trainer + DeepSpeed ZeRO-1,
hf-ddp the Trainer's own DDP). An engine added to the registry is in the benchmark.

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

from zero_train.bench.targets import PEER_PREFIX, TARGET_ENGINES
from zero_train.ds_config.keys import PRECISIONS
from zero_train.launch.cells import cell_config
from zero_train.launch.command import Launch
from zero_train.registry import ENGINES, EngineSpec
from zero_train.train import args as train_args
from zero_train.train.config import (
    DataConfig,
    EngineConfig,
    EvalConfig,
    ModelConfig,
    OutputConfig,
    RunConfig,
    TrainingConfig,
)

PEER_MODULE = "zero_train.bench.peer_main"
"""The Hugging Face Trainer peer's entry point (scripts/hf_trainer.py is a shim of it)."""


@dataclass(frozen=True, slots=True)
class BenchEngine:
    """One engine of the benchmark (a row of its tables)."""

    name: str
    """Table key and file stem part, e.g. "zero1", "hf-ds1"."""
    engine: EngineSpec
    """The registry's engine it runs (train.py's --engine, or the Trainer peer's)."""
    peer: bool = False
    """True: the Hugging Face Trainer (zero_train.bench.hf_peer) trains, not zero_train.train."""

    @property
    def zero_stage(self) -> int:
        """ZeRO stage of the DeepSpeed config generated for it (0: DDP)."""
        return self.engine.stage

    @property
    def label(self) -> str:
        """How the tables name it: ours in bold."""
        if self.peer:
            return f"{self.name} (HF Trainer + {self.engine.label})"
        return f"**{self.name} (ours)**" if self.engine.ours else f"{self.name} ({self.engine.label})"

    @property
    def default(self) -> bool:
        """In the default `--engines`: the registry's defaults, and a peer only where a target compares it
        (a Trainer run costs as much as ours)."""
        return self.name in TARGET_ENGINES if self.peer else self.engine.default


BENCH_REGISTRY: dict[str, BenchEngine] = {
    bench.name: bench
    for bench in (
        *(BenchEngine(spec.name, spec) for spec in ENGINES),
        *(BenchEngine(f"{PEER_PREFIX}{spec.name}", spec, peer=True) for spec in ENGINES if spec.hf_peer),
    )
}
BENCH_ENGINES = tuple(BENCH_REGISTRY)
DEFAULT_ENGINES = tuple(name for name, bench in BENCH_REGISTRY.items() if bench.default)
# of ds_config.keys.PRECISIONS: DeepSpeed runs fp16 on a CPU only where oneDNN has fp16 kernels (AVX512-FP16)
BENCH_PRECISIONS = tuple(p for p in PRECISIONS if p != "fp16")


@dataclass(frozen=True, slots=True)
class Cell:
    """One engine at one precision."""

    engine: str
    """A name in BENCH_REGISTRY."""
    precision: str
    """"fp32" | "bf16"."""

    @property
    def name(self) -> str:
        """File stem and table key, e.g. `zero1-bf16`."""
        return f"{self.engine}-{self.precision}"

    @property
    def spec(self) -> BenchEngine:
        """The bench's entry of the engine (peers included)."""
        return BENCH_REGISTRY[self.engine]

    @property
    def engine_spec(self) -> EngineSpec:
        """The registry's engine it runs."""
        return self.spec.engine

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


def cell_ds_config(cell: Cell, args: argparse.Namespace, hidden_size: int | None) -> dict:
    """The DeepSpeed config of the cell (profile's generator: every engine and the peer read the same)."""
    return cell_config(
        cell.engine_spec.name,
        args.world_size,
        precision=cell.precision,
        micro_batch_size=args.micro_batch_size,
        grad_accum=args.grad_accum,
        hidden_size=hidden_size,
    )


def steps_of(cell: Cell, args: argparse.Namespace) -> tuple[int, int]:
    """(optimizer steps, warm-up steps left out of the median) of the cell's runs: --bf16-steps and
    --bf16-warmup for bf16 cells (fewer where the CPU emulates bf16), --steps and --warmup otherwise."""
    if cell.precision == "bf16":
        return args.bf16_steps, args.bf16_warmup
    return args.steps, args.warmup


def run_config(cell: Cell, args: argparse.Namespace, paths: dict[str, pathlib.Path]) -> RunConfig:
    """The training run of one bench run (the same under any launcher and in one-launch mode).

    Args:
        cell: the cell.
        args: the bench flags.
        paths: "config", "record", "metrics" of this run.
    """
    return RunConfig(
        model=ModelConfig(model=args.model, gradient_checkpointing=args.gradient_checkpointing),
        data=DataConfig(dataset=args.dataset, block_size=args.block_size),
        training=TrainingConfig(
            max_steps=steps_of(cell, args)[0],
            micro_batch_size=args.micro_batch_size,
            grad_accum=args.grad_accum,
        ),
        engine=EngineConfig(engine=cell.engine_spec.name, deepspeed_config=str(paths["config"])),
        evaluation=EvalConfig() if cell.is_peer else EvalConfig(eval_batches=1),  # the peer does not evaluate
        output=OutputConfig(
            memory_report=str(paths["record"]),
            metrics_file=str(paths["metrics"]),
            progress=False,
            counted_steps=min(OutputConfig().counted_steps, steps_of(cell, args)[1]),
        ),
    )  #  # syncs are counted in the warm-up steps only: counting slows the steps it counts


def run_argv(cell: Cell, args: argparse.Namespace, paths: dict[str, pathlib.Path]) -> list[str]:
    """The flags of one bench run (run_config's, as train.py and the peer take them)."""
    return train_args.run_argv(run_config(cell, args, paths))


def bench_launch(args: argparse.Namespace, port: int) -> Launch:
    """`torchrun --nproc_per_node N --master_port P` (or DeepSpeed's launcher) for --world-size ranks."""
    return Launch(launcher=args.launcher, nproc_per_node=args.world_size, master_port=port)


def run_program(cell: Cell, args: argparse.Namespace) -> dict[str, str | None]:
    """What a run's own launch (--launch per-run) starts, as launch_command's `module` or `script`: the Trainer
    peer's module, or --train-script (None: the training entry point)."""
    return dict(module=PEER_MODULE) if cell.is_peer else dict(script=args.train_script)
