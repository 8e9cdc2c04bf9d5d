"""The typed run config: every setting of one training run, in parts (torchtitan's JobConfig, in our size).

    config = parse_args(["--engine", "ds2", "--model", "gpt2-25m", "--max-steps", "30"])   # zero_train.train.args
    config.engine.engine, config.training.max_steps, config.checkpoint.save_dir
    RunConfig(model=ModelConfig(model="gpt2-25m"), training=TrainingConfig(max_steps=30))  # the same, in code

The parts are the tables of a `--config run.toml` file and what each piece of the run receives: the loop its
`training`, `evaluation` and `output`, the checkpoints their `checkpoint`. Every field is one flag of train.py
(`block_size` -> `--block-size`; zero_train.train.args derives the parser from these fields) and its docstring
is that flag's help. `__post_init__` checks each value as the flag's type would (one line naming the field and
the fix); what needs files or the model (paths, the context length) is checked when the run is planned.

Batch sizes, lr, warmup, clipping and precision default to None: they fill a `--deepspeed_config`'s "auto"
values (a concrete value that disagrees with a given flag is an error, as in the HF Trainer); without a config,
one is generated with every value "auto"; what no flag fills takes train.py's default, else the HF Trainer's
(zero_train.ds_config.keys: the `run` and `hf` columns). The HF Trainer's spellings are aliases where they mean
the same (the field's `names` and `switches`; zero_train.train.args refuses the others, naming what to use).
RunConfig fills in the paths --output-dir implies and checks settings that need one another.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from zero_train.ds_config.keys import LOAD_DTYPES, LR_SCHEDULER_TYPES, PRECISIONS
from zero_train.registry import FAMILIES, engine_help, engine_names
from zero_train.runtime.defaults import default_for
from zero_train.runtime.errors import UsageError
from zero_train.runtime.parser import non_negative_float, non_negative_int, positive_float, positive_int
from zero_train.train.config_flags import check_part, flag
from zero_train.train.numerics import NONFINITE_POLICIES
from zero_train.train.tracking import parse_report_to

DEFAULT_MAX_STEPS = 100
"""The optimizer steps of a run given neither --max-steps nor --num-train-epochs."""


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """[model]: what is trained."""

    model: str = flag(
        default_for("model", "train"), names=("--model", "--model_name_or_path", "--model-name-or-path")
    )
    """a preset trained from random weights (tiny, gpt2-25m, gpt2-small, llama-tiny, llama-60m, qwen2-tiny, or a
    published shape such as llama-3-8b), a config.json file, or pretrained weights: a save_pretrained folder or a
    hub id"""
    tokenizer: str | None = flag(None, names=("--tokenizer", "--tokenizer_name"))
    """a tokenizer folder or hub id, or stdlib-bpe (the shipped offline one); default: the model's own for a folder
    or hub id, stdlib-bpe for a preset, a shape or a config.json"""
    gradient_checkpointing: bool = flag(
        default_for("gradient_checkpointing", "train"),
        names=("--gradient-checkpointing", "--gradient_checkpointing"),
    )
    """activation checkpointing: keep each block's input only and recompute the block in backward (Hugging Face's,
    non-reentrant; less memory, ~1/3 more compute)"""
    load_dtype: str = flag(default_for("load_dtype", "train"), choices=tuple(LOAD_DTYPES))
    """the dtype each rank builds (or loads) the model in on the host before the engine casts it to the training
    precision: bf16 needs half the host memory and, for a bf16 run, gives the same weights; ds3 builds under
    DeepSpeed's zero.Init, in the config's precision and partitioned at once, whatever this says"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class LoraConfig:
    """[lora]: LoRA adapters (peft) on a frozen base, on every engine; r = 0 trains every weight."""

    r: int = flag(0, parse=non_negative_int, names=("--lora-r",), metavar="R")
    """LoRA rank of the adapters (peft's LoraConfig/get_peft_model); 0 = off, every weight trains"""
    alpha: float = flag(8.0, parse=positive_float, names=("--lora-alpha",), metavar="ALPHA")
    """LoRA scaling numerator: the adapters' update is scaled by alpha / r (peft's default)"""
    dropout: float = flag(0.0, parse=non_negative_float, names=("--lora-dropout",), metavar="P")
    """dropout on the adapters' input, in [0, 1)"""
    target_modules: str | None = flag(None, names=("--lora-target-modules",), metavar="NAMES")
    """comma-separated module names (or 'all-linear') that get adapters (default: peft's choice for the
    architecture, else every linear layer of the attention and the MLP)"""

    def __post_init__(self) -> None:
        check_part(self)
        if self.dropout >= 1:
            raise UsageError(
                f"dropout (--lora-dropout): {self.dropout} is not below 1; use a value in [0, 1)"
            )
        if self.target_modules is not None and not target_module_names(self.target_modules):
            raise UsageError("target_modules (--lora-target-modules): no module name given; drop the flag")

    @property
    def enabled(self) -> bool:
        """Whether the run trains LoRA adapters (r > 0) rather than every weight."""
        return self.r > 0

    def recorded(self) -> dict[str, Any] | None:
        """What a checkpoint's run.json records (None: every weight trained); a resume must ask for the same."""
        return {spec.name: getattr(self, spec.name) for spec in fields(self)} if self.enabled else None

    def spec(self):
        """The adapters as zero_train.hf.lora.LoraSpec, None when off (r = 0)."""
        if not self.enabled:
            return None
        # expensive: hf.lora imports torch; this module stays free of it
        from zero_train.hf.lora import LoraSpec  # here: the config module stays free of torch

        names = target_module_names(self.target_modules) if self.target_modules is not None else None
        targets = tuple(names) if names is not None else None
        return LoraSpec(r=self.r, alpha=self.alpha, dropout=self.dropout, target_modules=targets)


def target_module_names(text: str) -> list[str]:
    """The names of a --lora-target-modules value ("q_proj, v_proj" -> ["q_proj", "v_proj"])."""
    return [name.strip() for name in text.split(",") if name.strip()]


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """[data]: what it is trained on."""

    dataset: str | None = flag(
        default_for("dataset", "train"), names=("--dataset", "--dataset_name", "--train_file")
    )
    """'stdlib' (the offline default: Python's own sources), a local file or folder (txt, json, jsonl, csv,
    parquet), or a hub id"""
    dataset_config: str | None = flag(
        None, metavar="NAME", names=("--dataset-config", "--dataset_config_name")
    )
    """the hub dataset's configuration (subset), e.g. wikitext-2-raw-v1 (or --dataset ID:NAME); also of a local
    clone of a hub dataset (the configurations its README.md declares)"""
    text_column: str | None = flag(None, metavar="COLUMN")
    """the column to train on (default: text; with --sft: messages)"""
    block_size: int = flag(
        default_for("block_size", "train"), parse=positive_int, names=("--block-size", "--block_size")
    )
    """tokens per training sequence"""
    streaming: bool = flag(False)
    """read the dataset lazily while training (datasets' streaming): no tokenizing pass first, each rank reads its
    own share, the read position is in each checkpoint; needs --max-steps"""
    sft: bool = flag(False)
    """supervised fine-tuning on conversations (a list of {role, content} per row), rendered with the tokenizer's
    chat template (the offline tokenizer's: 'role: content' lines, EOS after each assistant turn); the loss is on
    the assistant turns only"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    """[training]: how long, in which batches and precision (what the loop runs)."""

    max_steps: int | None = flag(None, parse=positive_int, names=("--max-steps", "--max_steps"))
    """optimizer steps to train, over --num-train-epochs if both are given (default: that many epochs, else 100)"""
    num_train_epochs: float | None = flag(
        None, parse=positive_float, names=("--num-train-epochs", "--num_train_epochs")
    )
    """passes over the training split, counted in optimizer steps as the HF Trainer does: ceil(epochs x
    max(1, micro-batches per epoch // grad accum)); the size must be known (not with --streaming)"""
    micro_batch_size: int | None = flag(
        default_for("micro_batch_size", "train"),
        parse=positive_int,
        names=("--micro-batch-size", "--per_device_train_batch_size"),
    )
    """sequences per rank per micro-step (default: the DeepSpeed config's, else 2)"""
    grad_accum: int | None = flag(
        default_for("grad_accum", "train"),
        parse=positive_int,
        names=("--grad-accum", "--gradient_accumulation_steps"),
    )
    """micro-steps per optimizer step (default: the DeepSpeed config's, else 1)"""
    precision: str | None = flag(
        default_for("precision", "train"), choices=PRECISIONS, switches={"--bf16": "bf16", "--fp16": "fp16"}
    )
    """fills the DeepSpeed config's fp16/bf16 "enabled": "auto" (a generated config's are); a config that sets
    them, or has neither section (fp32), must agree or the run is refused (default: the config's, else fp32)"""
    seed: int = flag(0, parse=non_negative_int)
    """model init, data order"""
    on_nonfinite: str = flag("stop", choices=NONFINITE_POLICIES)
    """a NaN/inf loss or grad norm: stop the run or skip the step"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """[optimizer]: values that fill the DeepSpeed config's "auto" (a concrete value there must agree)."""

    lr: float | None = flag(None, parse=positive_float, names=("--lr", "--learning_rate", "--learning-rate"))
    """peak learning rate (default: the DeepSpeed config's, else 5e-5 for pretrained weights, a folder or hub id,
    as the HF Trainer, and 1e-3 from random weights, a preset, shape or config.json)"""
    weight_decay: float | None = flag(
        None, parse=non_negative_float, names=("--weight-decay", "--weight_decay")
    )
    """AdamW's decoupled weight decay (default: the DeepSpeed config's, else 0.0, the HF Trainer's)"""
    lr_scheduler_type: str | None = flag(
        None, choices=LR_SCHEDULER_TYPES, names=("--lr-scheduler-type", "--lr_scheduler_type")
    )
    """the HF Trainer's schedule where the DeepSpeed config has no scheduler block (default: linear for pretrained
    weights; from random weights the config's constant lr, or without a config warmup + cosine: train.schedule)"""
    warmup_steps: int | None = flag(None, parse=non_negative_int, names=("--warmup-steps", "--warmup_steps"))
    """linear warmup steps (default: --warmup-ratio's, else the DeepSpeed config's, else 0 for pretrained weights
    and max(1, max steps // 10) from random weights); a DeepSpeed scheduler warms up at least 2 steps, from lr 0"""
    warmup_ratio: float | None = flag(
        None, parse=non_negative_float, names=("--warmup-ratio", "--warmup_ratio")
    )
    """warmup as a fraction (below 1) of the run's steps: ceil(ratio x steps) warmup steps, as the HF Trainer"""
    grad_clip: float | None = flag(
        None, parse=non_negative_float, names=("--grad-clip", "--max_grad_norm", "--max-grad-norm")
    )
    """max global grad norm, 0 = off (default: the DeepSpeed config's, else 1.0)"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class EngineConfig:
    """[engine]: which engine shards what, configured by one DeepSpeed JSON."""

    engine: str = flag(
        "deepspeed", choices=(*engine_names(), *FAMILIES), metavar="ENGINE", describe=engine_help
    )
    """the engine (zero_train.registry) or a library's alias, which follows the config's ZeRO stage (without
    --deepspeed_config: deepspeed runs ds2, fsdp2 runs fsdp2-z3)"""
    deepspeed_config: str | None = flag(
        None, names=("--deepspeed_config", "--deepspeed-config", "--deepspeed"), metavar="FILE"
    )
    """DeepSpeed JSON (batch sizes, precision, optimizer, schedule, clipping, ZeRO stage) read by every engine;
    'auto' values are filled from the flags (default: a generated config, every value 'auto')"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """[checkpoint]: what the run saves, resumes from and exports."""

    save_dir: str | None = flag(None, metavar="DIR")
    """checkpoint directory (default: --output-dir's checkpoints/; none: no checkpoints)"""
    save_every: int = flag(0, parse=non_negative_int, names=("--save-every", "--save_steps", "--save-steps"))
    """checkpoint every K steps and at the end (needs a checkpoint directory; 0 = only at the end)"""
    save_total_limit: int | None = flag(
        None, parse=positive_int, metavar="K", names=("--save-total-limit", "--save_total_limit")
    )
    """keep only the last K complete checkpoints (older ones are deleted once a new one is complete; never the one
    `latest` names, nor one being read)"""
    async_save: bool = flag(False)
    """write checkpoints in a background thread (state copied to host memory first); training goes on meanwhile,
    `latest` moves when the write is complete"""
    resume: str | None = flag(None, metavar="PATH|auto", names=("--resume", "--resume_from_checkpoint"))
    """a checkpoint dir, a save dir (follows its `latest`), or 'auto' (the checkpoint directory's latest, if any)"""
    export_hf: str | None = flag(None, metavar="DIR|auto")
    """at the end, write a Hugging Face folder (config, safetensors, tokenizer) to DIR (auto: --output-dir's hf/)"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    """[evaluation]: held-out loss and perplexity."""

    eval_every: int = flag(0, parse=non_negative_int, names=("--eval-every", "--eval_steps", "--eval-steps"))
    """eval loss + perplexity on the held-out split every K steps and at the end (0 = end only)"""
    eval_batches: int = flag(8, parse=positive_int)
    """micro-batches per rank per evaluation, at most (fewer if the held-out split is smaller)"""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(kw_only=True, slots=True)
class OutputConfig:
    """[output]: where the run's files go, what it prints and reports besides checkpoints."""

    output_dir: str | None = flag(None, metavar="DIR", names=("--output-dir", "--output_dir"))
    """one folder for the run: checkpoints/ (unless --save-dir), metrics.jsonl (unless --metrics-file, or
    --report-to leaves jsonl out), train.log (what rank 0 prints), runs/ (tracking files), hf/ (with --export-hf
    auto)"""
    report_to: str | None = flag(
        None, parse=parse_report_to, metavar="LIST", names=("--report-to", "--report_to")
    )
    """where the metrics go: a comma list of jsonl, tensorboard, trackio, wandb (offline unless WANDB_MODE is set),
    mlflow; 'all' (every installed one) or 'none'; a metrics file (--metrics-file, --output-dir's) adds jsonl
    (default: jsonl when there is a metrics file)"""
    run_name: str | None = flag(None, names=("--run-name", "--run_name"))
    """the run's name in trackio, W&B and MLflow (default: --output-dir's folder name)"""
    log_every: int = flag(1, parse=positive_int, names=("--log-every", "--logging-steps", "--logging_steps"))
    """print the step line, and report to the trackers, every K steps (the loop reads the device only then)"""
    metrics_file: str | None = flag(None, metavar="FILE")
    """JSONL: one object per step and per evaluation (rank 0 writes; default: --output-dir's metrics.jsonl)"""
    overwrite_output_dir: bool = flag(False, names=("--overwrite-output-dir", "--overwrite_output_dir"))
    """train into an --output-dir that holds files (its old checkpoints are deleted first); without it (or
    --resume) such a folder is refused, as by the HF Trainer"""
    memory_report: str | None = flag(None, metavar="FILE")
    """write the per-rank memory run record (JSON)"""
    counted_steps: int = flag(2, parse=non_negative_int, metavar="K")
    """with --memory-report: count host syncs, collectives and overlap over the first K steps (0: none)"""
    progress: bool = flag(True, negated="--no-progress", switches={"--disable_tqdm": False})
    """a progress bar on rank 0 in a terminal (--no-progress: none; the step lines stay)"""

    def __post_init__(self) -> None:
        if isinstance(self.report_to, (list, tuple)):  # a TOML list, as HF's report_to
            self.report_to = ",".join(self.report_to)
        check_part(self)


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """Every setting of one training run, by part; the paths --output-dir implies are filled in here."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """What is trained."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters on a frozen base (off by default)."""
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
    """The run's folder, step lines, metrics and trackers, the memory run record."""

    def __post_init__(self) -> None:
        for part in fields(self):
            if not isinstance(getattr(self, part.name), PARTS[part.name]):
                raise ValueError(f"RunConfig.{part.name} must be a {PARTS[part.name].__name__}")
        self.checkpoint, self.output = output_paths(self.checkpoint, self.output)
        check_across_parts(self)


def output_paths(checkpoint: CheckpointConfig, output: OutputConfig) -> tuple[CheckpointConfig, OutputConfig]:
    """The paths --output-dir implies where none is given (as the HF Trainer's output_dir): new parts."""
    folder = output.output_dir
    if folder is None:
        if checkpoint.export_hf == "auto":
            raise UsageError("--export-hf auto needs --output-dir (it writes DIR/hf)")
        return checkpoint, output
    wants_jsonl = output.report_to in (None, "all") or "jsonl" in output.report_to.split(",")
    if output.metrics_file is None and wants_jsonl:
        output = replace(output, metrics_file=os.path.join(folder, "metrics.jsonl"))
    checkpoint = replace(
        checkpoint,
        save_dir=checkpoint.save_dir or os.path.join(folder, "checkpoints"),
        export_hf=os.path.join(folder, "hf") if checkpoint.export_hf == "auto" else checkpoint.export_hf,
    )
    return checkpoint, output


def check_across_parts(config: RunConfig) -> None:
    """UsageError for settings that need one another (one line naming both and the fix)."""
    checkpoint, output, training = config.checkpoint, config.output, config.training
    where = "--save-dir or --output-dir (where to write checkpoints)"
    for name, given in (
        ("--save-every", checkpoint.save_every),
        ("--save-total-limit", checkpoint.save_total_limit),
        ("--async-save", checkpoint.async_save),
    ):
        if given and not checkpoint.save_dir:
            raise UsageError(f"{name} needs {where}")
    if checkpoint.resume == "auto" and not checkpoint.save_dir:
        raise UsageError(
            "--resume auto needs --save-dir or --output-dir (where to look for the latest checkpoint)"
        )
    if output.report_to == "none" and output.metrics_file:
        raise UsageError("--report-to none but --metrics-file is given; drop one of them")
    trackers = [name for name in (output.report_to or "").split(",") if name not in ("", "none", "jsonl")]
    if trackers and not output.output_dir:
        raise UsageError(f"--report-to {trackers[0]} needs --output-dir (its files go to DIR/runs)")
    if "jsonl" in (output.report_to or "").split(",") and not output.metrics_file:
        raise UsageError("--report-to jsonl needs --metrics-file or --output-dir (the file it writes)")
    if config.data.streaming and training.max_steps is None:
        raise UsageError(
            "--streaming reads the dataset lazily, so its size (and the steps of an epoch) is unknown; "
            "give --max-steps"
        )


PARTS: dict[str, type] = {
    "model": ModelConfig,
    "lora": LoraConfig,
    "data": DataConfig,
    "training": TrainingConfig,
    "optimizer": OptimizerConfig,
    "engine": EngineConfig,
    "checkpoint": CheckpointConfig,
    "evaluation": EvalConfig,
    "output": OutputConfig,
}
"""Part name (a RunConfig field, a TOML table) -> its dataclass."""
