"""The runs of the acceptance check, as bench worker plans: every engine trains in ONE launch of ranks.

    runs = main_runs(settings)        # per engine: fp32 (checkpoint at step 2), its resume + export, bf16
    runs = elastic_runs(settings)     # our engines' step-2 checkpoints resumed at world size 1

Every engine of zero_train.registry (and the Hugging Face Trainer peers the bench compares, with the Trainer's
own DDP as their reference) runs the same model, data, batch and seed, so that its fp32 losses can be held
against DDP's. The whole plan goes to zero_train.bench.worker (one launch, each run from a fresh model, torn
down before the next), because a launch of ranks costs more than a tiny run (docs/startup.md#launching-ranks).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from zero_train.bench.cells import BENCH_REGISTRY
from zero_train.bench.targets import TARGET_ENGINES
from zero_train.ds_config import write_config
from zero_train.launch.cells import cell_config
from zero_train.registry import ENGINES, REFERENCE
from zero_train.train import args as train_args
from zero_train.train.config import (
    CheckpointConfig,
    DataConfig,
    EngineConfig,
    EvalConfig,
    ModelConfig,
    OutputConfig,
    RunConfig,
    TrainingConfig,
)

RESUME_STEP = 2
"""The checkpoint the resume runs start from (the fp32 run saves every RESUME_STEP steps)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """What every run of the check shares."""

    model: str
    """The preset trained (tiny on CPU ranks)."""
    world_size: int
    steps: int
    """Optimizer steps of the fp32 and bf16 runs (the resume runs end at the same step)."""
    micro_batch_size: int
    block_size: int
    out: pathlib.Path
    """The check's directory: configs/, runs/, ckpt/, export/, logs/."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """One training run of the plan."""

    name: str
    """File stem, e.g. "zero1-fp32", "zero1-resume", "hf-ds1-bf16", "zero1-elastic"."""
    engine: str
    """A name of zero_train.bench.cells.BENCH_REGISTRY (registry engines and hf-* peers)."""
    kind: str
    """"fp32", "bf16", "resume" (fp32 from the step-RESUME_STEP checkpoint, then export) or "elastic"."""
    precision: str
    peer: bool
    argv: list[str]

    def paths(self, out: pathlib.Path) -> dict[str, pathlib.Path]:
        """Where its metrics, record, done file and export go."""
        return self.paths_of(out, self.name, self.engine)

    @staticmethod
    def paths_of(out: pathlib.Path, name: str, engine: str) -> dict[str, pathlib.Path]:
        """The paths of run `name` of `engine` under the check's directory `out`."""
        return dict(
            metrics=out / "runs" / f"{name}.jsonl",
            record=out / "runs" / f"{name}.json",
            done=out / "runs" / f"{name}.done.json",
            export=out / "export" / engine,
        )


def check_engines() -> tuple[str, ...]:
    """Every registry engine, then the Trainer peers the bench's targets compare, and hf-ddp, their reference."""
    peers = [name for name, bench in BENCH_REGISTRY.items() if bench.peer and name in TARGET_ENGINES]
    reference = [
        name for name, bench in BENCH_REGISTRY.items() if bench.peer and bench.engine.name == REFERENCE
    ]
    return tuple(dict.fromkeys([spec.name for spec in ENGINES] + reference + peers))


def save_dir(settings: Settings, engine: str) -> pathlib.Path:
    """The fp32 run's checkpoints (the resume runs read its step-RESUME_STEP one)."""
    return settings.out / "ckpt" / engine


def step_checkpoint(settings: Settings, engine: str, step: int = RESUME_STEP) -> pathlib.Path:
    """The folder of the fp32 run's checkpoint at `step` (zero_train.checkpoint.rotation's STEP_DIR)."""
    return save_dir(settings, engine) / f"step-{step:08d}"


def _run(settings: Settings, engine: str, kind: str, **changes) -> Run:
    """One run of the check. Its RunConfig has the shape of bench.cells.run_config's (hence the same imports),
    from other inputs: the check's Settings and checkpoint `changes`, where the bench has a cell and its flags."""
    bench = BENCH_REGISTRY[engine]
    precision = "bf16" if kind == "bf16" else "fp32"
    name = f"{engine}-{kind}"
    world_size = changes.pop("world_size", settings.world_size)
    micro_batch_size = changes.pop("micro_batch_size", settings.micro_batch_size)
    config_path = settings.out / "configs" / f"{engine}-{precision}-w{world_size}.json"
    write_config(
        cell_config(bench.engine.name, world_size, precision=precision, micro_batch_size=micro_batch_size),
        config_path,
    )
    paths = Run.paths_of(settings.out, name, engine)
    config = RunConfig(
        model=ModelConfig(model=settings.model),
        data=DataConfig(block_size=settings.block_size),
        training=TrainingConfig(max_steps=settings.steps, micro_batch_size=micro_batch_size),
        engine=EngineConfig(engine=bench.engine.name, deepspeed_config=str(config_path)),
        checkpoint=CheckpointConfig(**changes),
        evaluation=EvalConfig() if bench.peer else EvalConfig(eval_batches=1),
        output=OutputConfig(
            memory_report=str(paths["record"]), metrics_file=str(paths["metrics"]), progress=False
        ),
    )
    return Run(
        name=name,
        engine=engine,
        kind=kind,
        precision=precision,
        peer=bench.peer,
        argv=train_args.run_argv(config),
    )


def main_runs(settings: Settings, *, precisions: tuple[str, ...]) -> list[Run]:
    """Per engine: fp32 (saving every RESUME_STEP steps; the peers do not save), its resume from step
    RESUME_STEP with an export, and bf16 where `precisions` has it. fp32 runs first, DDP first."""
    runs = []
    for engine in check_engines():
        peer = BENCH_REGISTRY[engine].peer
        saving = {} if peer else dict(save_dir=str(save_dir(settings, engine)), save_every=RESUME_STEP)
        runs.append(_run(settings, engine, "fp32", **saving))
        if not peer:
            export = settings.out / "export" / engine
            runs.append(
                _run(
                    settings,
                    engine,
                    "resume",
                    resume=str(step_checkpoint(settings, engine)),
                    export_hf=str(export),
                )
            )
    if "bf16" in precisions:
        runs += [_run(settings, engine, "bf16") for engine in check_engines()]
    return runs


def elastic_engines() -> tuple[str, ...]:
    """The engines resumed at another world size: ours and every library one whose checkpoint re-shards."""
    return tuple(spec.name for spec in ENGINES)


def elastic_runs(settings: Settings, *, world_size: int) -> list[Run]:
    """Each engine's step-RESUME_STEP checkpoint resumed at `world_size` ranks with the same global batch (the
    micro-batch scaled by settings.world_size / world_size, so each step sees the same blocks)."""
    micro = settings.micro_batch_size * settings.world_size // world_size
    return [
        _run(
            settings,
            engine,
            "elastic",
            resume=str(step_checkpoint(settings, engine)),
            world_size=world_size,
            micro_batch_size=micro,
        )
        for engine in elastic_engines()
    ]
