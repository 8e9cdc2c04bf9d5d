"""The typed run config: every setting of one training run, in parts (torchtitan's JobConfig, in our size).

    config = parse_args(["--engine", "ds2", "--model", "gpt2-25m", "--max-steps", "30"])   # zero_train.train.args
    config.engine.engine, config.training.max_steps, config.checkpoint.save_dir
    RunConfig(model=ModelConfig(model="gpt2-25m"), training=TrainingConfig(max_steps=30))  # the same, in code

The parts are the tables of a `--config run.toml` file and what each piece of the run receives: the loop its
`training`, `evaluation` and `output`, the checkpoints their `checkpoint`. Every field is one flag of train.py
(`block_size` -> `--block-size`; zero_train.train.args derives the parser from these fields) and its docstring
is that flag's help. `__post_init__` checks each value as the flag's type would (one line naming the field and
the fix); what needs files or the model (paths, the context length) is checked when the run is planned.

Batch sizes, lr, warmup, clipping and precision default to None: with a `--deepspeed_config` they only fill its
"auto" values (a concrete config value that disagrees with a given flag is an error, as in the Hugging Face
Trainer); without one, a config is generated with every value "auto", and what no flag fills takes train.py's
default, else the HF Trainer's (zero_train.ds_config.keys: the `run` and `hf` columns).
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from zero_train.ds_config.keys import PRECISIONS
from zero_train.registry import FAMILIES, engine_help, engine_names
from zero_train.runtime.defaults import default_for
from zero_train.runtime.errors import UsageError
from zero_train.runtime.parser import non_negative_float, non_negative_int, positive_float, positive_int
from zero_train.train.numerics import NONFINITE_POLICIES


def flag(default: Any, *, parse=None, choices=None, names: tuple[str, ...] = (), metavar: str | None = None,
         negated: str | None = None, describe=None) -> Any:  # fmt: skip
    """A field that is a flag of train.py.

    Args:
        default: the field's default (the flag's when not given).
        parse: the argparse type (zero_train.runtime.parser): it also checks values from a file or code.
        choices: the values allowed.
        names: the flag's spellings (default: `--field-name`).
        metavar: as argparse's.
        negated: a bool field True by default, switched off by this flag (e.g. "--no-progress").
        describe: a function giving the choices in words (appended to the help; derived, never written here).
    """
    return field(default=default, metadata=dict(parse=parse, choices=choices, names=names, metavar=metavar,
                                                negated=negated, describe=describe))  # fmt: skip


def check_part(part) -> None:
    """Check and normalise every field of a part as its flag's type would (UsageError: one line)."""
    for spec in fields(part):
        value, meta = getattr(part, spec.name), spec.metadata
        if value is None:
            continue
        where = f"{spec.name} ({flag_names(spec)[0]})"
        if isinstance(spec.default, bool) and not isinstance(value, bool):
            raise UsageError(f"{where}: expected true or false, got {value!r}")
        if meta.get("parse") is not None:
            try:
                value = meta["parse"](str(value))
            except argparse.ArgumentTypeError as err:
                raise UsageError(f"{where}: {err}") from None
            setattr(part, spec.name, value)
        elif spec.type in ("str | None", "str") and not isinstance(value, str):
            raise UsageError(f"{where}: expected a string, got {value!r}")
        if meta.get("choices") is not None and value not in meta["choices"]:
            raise UsageError(f"{where}: {value!r} is not one of {', '.join(meta['choices'])}")


def flag_names(spec) -> tuple[str, ...]:
    """The flag spellings of a field (its `negated` flag for a switched-off bool)."""
    meta = spec.metadata
    if meta.get("negated"):
        return (meta["negated"],)
    return meta.get("names") or ("--" + spec.name.replace("_", "-"),)


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """[model]: what is trained."""

    model: str = flag(default_for("model", "train"))
    """a preset (tiny, gpt2-25m, gpt2-small, llama-tiny, llama-60m), a save_pretrained folder, or a hub id"""
    tokenizer: str | None = flag(None)
    """a tokenizer folder or hub id (default: the offline stdlib-bpe)"""
    gradient_checkpointing: bool = flag(default_for("gradient_checkpointing", "train"))
    """activation checkpointing: keep each block's input only and recompute the block in backward (Hugging Face's,
    non-reentrant; less memory, ~1/3 more compute)"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """[data]: what it is trained on."""

    dataset: str | None = flag(default_for("dataset", "train"))
    """'stdlib' (offline default), a local file/folder (txt, json, jsonl, csv, parquet), or a hub id[:config]"""
    block_size: int = flag(default_for("block_size", "train"), parse=positive_int)
    """tokens per training sequence"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    """[training]: how long, in which batches and precision (what the loop runs)."""

    max_steps: int = flag(100, parse=positive_int)
    """optimizer steps to train"""
    micro_batch_size: int | None = flag(default_for("micro_batch_size", "train"), parse=positive_int)
    """sequences per rank per micro-step"""
    grad_accum: int | None = flag(default_for("grad_accum", "train"), parse=positive_int)
    """micro-steps per optimizer step"""
    precision: str | None = flag(default_for("precision", "train"), choices=PRECISIONS)
    """override the config's precision"""
    seed: int = flag(0, parse=non_negative_int)
    """model init, data order"""
    on_nonfinite: str = flag("stop", choices=NONFINITE_POLICIES)
    """a NaN/inf loss or grad norm: stop the run or skip the step"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """[optimizer]: values that fill the DeepSpeed config's "auto" (None: the config's, else the defaults)."""

    lr: float | None = flag(None, parse=positive_float)
    """peak learning rate"""
    weight_decay: float | None = flag(None, parse=non_negative_float)
    """AdamW's decoupled weight decay"""
    warmup_steps: int | None = flag(None, parse=positive_int)
    """linear warmup steps of the schedule"""
    grad_clip: float | None = flag(None, parse=non_negative_float)
    """max global grad norm, 0 = off"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class EngineConfig:
    """[engine]: which engine shards what, configured by one DeepSpeed JSON."""

    engine: str = flag(
        "deepspeed", choices=(*engine_names(), *FAMILIES), metavar="ENGINE", describe=engine_help
    )
    """the engine (zero_train.registry) or a library's alias, which follows the config's ZeRO stage"""
    deepspeed_config: str | None = flag(
        None, names=("--deepspeed_config", "--deepspeed-config"), metavar="FILE"
    )
    """DeepSpeed JSON (batch sizes, precision, optimizer, schedule, clipping, ZeRO stage) read by every engine;
    'auto' values are filled from the flags (default: a generated config)"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """[checkpoint]: what the run saves, resumes from and exports."""

    save_dir: str | None = flag(None, metavar="DIR")
    """checkpoint directory"""
    save_every: int = flag(0, parse=non_negative_int)
    """checkpoint every K steps and at the end (needs --save-dir; 0 = only at the end)"""
    save_total_limit: int | None = flag(None, parse=positive_int, metavar="K")
    """keep only the last K complete checkpoints (older ones are deleted once a new one is complete; never the one
    `latest` names, nor one being read)"""
    async_save: bool = flag(False)
    """write checkpoints in a background thread (state copied to host memory first); training goes on meanwhile,
    `latest` moves when the write is complete"""
    resume: str | None = flag(None, metavar="PATH|auto")
    """a checkpoint dir, a save dir (follows its `latest`), or 'auto' (--save-dir's latest, if any)"""
    export_hf: str | None = flag(None, metavar="DIR")
    """at the end, write a Hugging Face folder (config, safetensors, tokenizer)"""

    def __post_init__(self) -> None:
        check_part(self)
        if self.save_every and not self.save_dir:
            raise UsageError("--save-every needs --save-dir (where to write checkpoints)")
        for name, given in (("--save-total-limit", self.save_total_limit), ("--async-save", self.async_save)):
            if given and not self.save_dir:
                raise UsageError(f"{name} needs --save-dir (where to write checkpoints)")
        if self.resume == "auto" and not self.save_dir:
            raise UsageError("--resume auto needs --save-dir (where to look for the latest checkpoint)")


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    """[evaluation]: held-out loss and perplexity."""

    eval_every: int = flag(0, parse=non_negative_int)
    """eval loss + perplexity on the held-out split every K steps and at the end (0 = end only)"""
    eval_batches: int = flag(8, parse=positive_int)
    """micro-batches per rank per evaluation"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class OutputConfig:
    """[output]: what the run prints and writes besides checkpoints."""

    log_every: int = flag(1, parse=positive_int)
    """print the step line every K steps"""
    metrics_file: str | None = flag(None, metavar="FILE")
    """JSONL: one object per step (rank 0 writes)"""
    memory_report: str | None = flag(None, metavar="FILE")
    """write the per-rank memory run record (JSON)"""
    progress: bool = flag(True, negated="--no-progress")
    """a progress bar on rank 0 in a terminal (--no-progress: none; the step lines stay)"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """Every setting of one training run, by part."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """What is trained."""
    data: DataConfig = field(default_factory=DataConfig)
    """What it is trained on."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """How long, in which batches and precision."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """What fills the DeepSpeed config's optimizer and schedule "auto" values."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The engine and its DeepSpeed config."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Saving, resuming, exporting."""
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """Step lines, metrics, the memory run record."""

    def __post_init__(self) -> None:
        for part in fields(self):
            if not isinstance(getattr(self, part.name), PARTS[part.name]):
                raise ValueError(f"RunConfig.{part.name} must be a {PARTS[part.name].__name__}")


PARTS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "training": TrainingConfig,
    "optimizer": OptimizerConfig,
    "engine": EngineConfig,
    "checkpoint": CheckpointConfig,
    "evaluation": EvalConfig,
    "output": OutputConfig,
}
"""Part name (a RunConfig field, a TOML table) -> its dataclass."""


def field_default(spec) -> Any:
    """A field's default value (its factory's result for a factory field)."""
    return spec.default_factory() if spec.default is MISSING else spec.default
