"""The one table of every DeepSpeed config key zero_train fills or defaults.

Each row names a DeepSpeed dotted key and says, in one place:

- which TrainSettings field it becomes (`field`) and DeepSpeed's default when the key is absent (`deepspeed`,
  DeepSpeed 0.19.8: runtime/constants.py, config.py, lr_schedules.py, fp16 loss_scaler.py);
- what `zero-train config` writes when its flag is not given (`generated`);
- whether it may be "auto", and then which value fills it (`fills`: a `train_settings` argument or one derived
  from them), the Hugging Face Trainer's value when no argument gives one (`hf`, TrainingArguments' defaults),
  scripts/train.py's value when no flag gives one (`run`, checked before `hf`), whether a given value also
  fills the key when the config leaves it out (`fill_absent`), and whether a concrete value must agree with a
  given one (`compared`; HF's fill_only keys are not compared);
- which flag gives the value (`flag`, for error messages).

`UNSET` means "no such default". A default that depends on other keys is a `Rule`: the rule in words, applied
where it is read (zero_train.ds_config.parse for DeepSpeed's, .generate for ours, zero_train.train.setup for
scripts/train.py's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zero_train.runtime.defaults import SHARED_DEFAULTS

AUTO = "auto"
PRECISIONS = ("fp32", "bf16", "fp16")
"""Every precision an engine trains in (fp16.enabled / bf16.enabled; fp32: neither)."""
LOAD_DTYPES = {"fp32": 4, "bf16": 2}
"""The dtypes train.py can build or load a model in on the host (--load-dtype) -> bytes per parameter."""
OPTIMIZER_TYPES = ("AdamW", "Adam", "SGD", "adamw", "adam", "sgd")
HF_SCHEDULERS = ("linear", "cosine", "constant_with_warmup")
"""The HF Trainer's lr_scheduler_type schedules our engines apply themselves where a config has no scheduler block
(DeepSpeed's engine gets them as its client lr_scheduler, as from the Trainer): zero_train.ds_config.schedule."""
LR_SCHEDULER_TYPES = ("linear", "cosine", "constant", "constant_with_warmup")
"""--lr-scheduler-type's choices (the HF Trainer's names; "constant" is also DeepSpeed's no-scheduler)."""


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""No default of this kind."""


class Rule(str):
    """A default that depends on other keys or flags, stated in words; applied where it is read."""


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One DeepSpeed config key and every default zero_train applies to it."""

    path: str
    """DeepSpeed's dotted key, e.g. "optimizer.params.lr"."""
    field: str | None
    """The TrainSettings field it becomes (None: only DeepSpeed reads it)."""
    flag: str
    """The scripts/train.py flag that gives its value, named in errors ("": no flag gives it)."""
    fills: str | None = None
    """The value that fills "auto" (None: "auto" is not allowed here)."""
    deepspeed: Any = UNSET
    """DeepSpeed's default when the key is absent (a rule in words where it depends on other keys)."""
    generated: Any = UNSET
    """What `zero-train config` writes when the flag is not given (without --hf-auto)."""
    hf: Any = UNSET
    """The HF Trainer's value for an "auto" that no argument fills."""
    run: Any = UNSET
    """scripts/train.py's value for an "auto" that no flag fills (a rule in words where it depends on flags)."""
    fill_absent: bool | tuple[str, ...] = False
    """A given value also fills the key when it is missing: always, never, or only for these section types."""
    compared: bool = True
    """A concrete value that disagrees with a given one is an error (False: HF's fill_only)."""


DEEPSPEED_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default reduce and all-gather bucket, in elements (5e8: 2 GB in fp32, allocated whole at the first
reduction); every other use reads it from here (deepspeed_default)."""
RUN_WARMUP = Rule("max(1, --max-steps // 10)")
RUN_TOTAL = Rule("--max-steps")
RUN_LR = Rule(
    "1e-3 to train from scratch (a preset, a shape, a config.json); 5e-5 to fine-tune (a folder or hub id)"
)
RUN_LR_FROM_SCRATCH = 1e-3
"""train.py's peak lr for randomly initialised weights (the offline presets, whose short runs need a high lr)."""
RUN_LR_FINE_TUNING = 5e-5
"""train.py's peak lr for pretrained weights: the HF Trainer's default (TrainingArguments.learning_rate); 1e-3 would
overwrite what the weights learned within a few steps."""
GENERATED_LR = RUN_LR_FINE_TUNING
"""What `zero-train config` writes without --lr: the fine-tuning lr (the HF Trainer's), for the README's recipe."""
WEIGHT_DECAY_DS = Rule("0.01 with torch_adam AdamW (torch's default), else 0.0 (FusedAdam / CPUAdam)")
WARMUP_MAX_LR_DS = Rule("optimizer.params.lr for WarmupLR, 0.001 for WarmupDecayLR")
BUCKET_FLAG = "--model (its hidden size)"
WARMUP_SCHEDULERS = ("WarmupLR", "WarmupDecayLR")
DECAY_SCHEDULERS = ("WarmupDecayLR", "WarmupCosineLR")

# A table, one ConfigKey per DeepSpeed key: the entries share a shape (and a comment names each group), not logic.
KEYS = (
    # batch
    ConfigKey(
        path="train_micro_batch_size_per_gpu",
        field="micro_batch_size",
        flag="--micro-batch-size",
        fills="micro_batch_size",
        deepspeed=Rule("train_batch_size / (grad_accum * world_size)"),
        generated=1,
        run=SHARED_DEFAULTS["micro_batch_size"].value,
        fill_absent=True,
    ),
    ConfigKey(
        path="gradient_accumulation_steps",
        field="grad_accum",
        flag="--grad-accum",
        fills="grad_accum",
        deepspeed=1,
        generated=1,
        hf=1,
        fill_absent=True,
    ),
    ConfigKey(
        path="train_batch_size",
        field="train_batch_size",
        flag="--micro-batch-size and --grad-accum",
        fills="train_batch_size",
        deepspeed=Rule("micro * grad_accum * world_size"),
    ),
    ConfigKey(
        path="gradient_clipping",
        field="grad_clip",
        flag="--grad-clip",
        fills="grad_clip",
        deepspeed=1.0,
        generated=1.0,
        hf=1.0,
        fill_absent=True,
    ),
    # optimizer
    ConfigKey(
        path="optimizer.params.lr",
        field="lr",
        flag="--lr",
        fills="lr",
        deepspeed=1e-3,
        generated=GENERATED_LR,
        run=RUN_LR,
        fill_absent=OPTIMIZER_TYPES,
    ),
    ConfigKey(
        path="optimizer.params.weight_decay",
        field="weight_decay",
        flag="--weight-decay",
        fills="weight_decay",
        deepspeed=WEIGHT_DECAY_DS,
        generated=0.0,
        hf=0.0,
        fill_absent=OPTIMIZER_TYPES,
    ),
    ConfigKey(
        path="optimizer.params.betas",
        field="betas",
        flag="",
        fills="betas",
        deepspeed=(0.9, 0.999),
        generated=(0.9, 0.999),
        hf=[0.9, 0.999],
    ),
    ConfigKey(
        path="optimizer.params.eps",
        field="eps",
        flag="",
        fills="eps",
        deepspeed=1e-8,
        generated=1e-8,
        hf=1e-8,
    ),
    ConfigKey(path="optimizer.params.momentum", field="momentum", flag="", deepspeed=0.0, generated=0.0),
    # scheduler
    ConfigKey(
        path="scheduler.params.warmup_min_lr",
        field="warmup_min_lr",
        flag="",
        fills="warmup_min_lr",
        deepspeed=0.0,
        generated=0.0,
        hf=0,
    ),
    ConfigKey(
        path="scheduler.params.warmup_max_lr",
        field="lr",
        flag="--lr",
        fills="lr",
        deepspeed=WARMUP_MAX_LR_DS,
        generated=GENERATED_LR,
        run=RUN_LR,
        fill_absent=WARMUP_SCHEDULERS,
    ),
    ConfigKey(
        path="scheduler.params.warmup_num_steps",
        field="warmup_steps",
        flag="--warmup-steps",
        fills="warmup_steps",
        deepspeed=1000,
        generated=1,
        run=RUN_WARMUP,
        fill_absent=(*WARMUP_SCHEDULERS, "WarmupCosineLR"),
    ),
    ConfigKey(
        path="scheduler.params.total_num_steps",
        field="total_steps",
        flag="--max-steps",
        fills="total_steps",
        run=RUN_TOTAL,
        fill_absent=DECAY_SCHEDULERS,
    ),
    ConfigKey(
        path="scheduler.params.warmup_type", field="warmup_type", flag="", deepspeed="log", generated="linear"
    ),
    ConfigKey(
        path="scheduler.params.warmup_min_ratio",
        field="warmup_min_ratio",
        flag="",
        deepspeed=0.0,
        generated=0.0,
    ),
    ConfigKey(
        path="scheduler.params.cos_min_ratio",
        field="min_lr_ratio",
        flag="",
        deepspeed=0.0001,
        generated=0.0001,
    ),
    # precision: filled from --precision as a whole (compared as a whole, not key by key)
    ConfigKey(
        path="fp16.enabled",
        field="precision",
        flag="--precision",
        fills="fp16",
        deepspeed=False,
        hf=False,
        compared=False,
    ),
    ConfigKey(
        path="bf16.enabled",
        field="precision",
        flag="--precision",
        fills="bf16",
        deepspeed=False,
        hf=False,
        compared=False,
    ),
    ConfigKey(path="fp16.loss_scale", field="fp16_loss_scale", flag="", deepspeed=0.0, generated=0),
    ConfigKey(
        path="fp16.initial_scale_power", field="fp16_initial_scale_power", flag="", deepspeed=16, generated=16
    ),
    ConfigKey(
        path="fp16.loss_scale_window", field="fp16_loss_scale_window", flag="", deepspeed=1000, generated=1000
    ),
    ConfigKey(path="fp16.hysteresis", field="fp16_hysteresis", flag="", deepspeed=2, generated=2),
    ConfigKey(path="fp16.min_loss_scale", field="fp16_min_loss_scale", flag="", deepspeed=1.0, generated=1),
    # ZeRO: what `zero-train config` writes is only what DeepSpeed reads at the stage (zero_train.ds_config.generate)
    ConfigKey(path="zero_optimization.stage", field="zero_stage", flag="", deepspeed=0, generated=2),
    ConfigKey(path="zero_optimization.overlap_comm", field=None, flag="", generated=Rule("true at stage 3")),
    ConfigKey(path="zero_optimization.contiguous_gradients", field=None, flag="", generated=True),
    ConfigKey(
        path="zero_optimization.allgather_bucket_size",
        field=None,
        flag="",
        deepspeed=DEEPSPEED_BUCKET_ELEMENTS,
        generated=DEEPSPEED_BUCKET_ELEMENTS,
    ),
    ConfigKey(
        path="zero_optimization.stage3_max_live_parameters",
        field=None,
        flag="",
        deepspeed=1_000_000_000,
        generated=1_000_000_000,
    ),
    ConfigKey(
        path="zero_optimization.stage3_gather_16bit_weights_on_model_save",
        field=None,
        flag="",
        deepspeed=False,
        generated=False,
    ),
    # ZeRO buckets: "auto" follows the model's hidden size h, as the HF integration does
    ConfigKey(
        path="zero_optimization.reduce_bucket_size",
        field=None,
        flag=BUCKET_FLAG,
        fills="reduce_bucket_size",
        deepspeed=DEEPSPEED_BUCKET_ELEMENTS,
        generated=Rule("h * h, else left out"),
        compared=False,
    ),
    ConfigKey(
        path="zero_optimization.stage3_prefetch_bucket_size",
        field=None,
        flag=BUCKET_FLAG,
        fills="stage3_prefetch_bucket_size",
        deepspeed=50_000_000,
        generated=Rule("int(0.9 * h * h), else 50_000_000"),
        compared=False,
    ),
    ConfigKey(
        path="zero_optimization.stage3_param_persistence_threshold",
        field=None,
        flag=BUCKET_FLAG,
        fills="stage3_param_persistence_threshold",
        deepspeed=100_000,
        generated=Rule("10 * h, else 100_000"),
        compared=False,
    ),
)

BY_PATH = {key.path: key for key in KEYS}
AUTO_KEYS = {key.path: key.fills for key in KEYS if key.fills is not None}
"""Dotted key -> the value that fills its "auto": exactly the keys the HF Trainer fills."""


def deepspeed_default(path: str) -> Any:
    """DeepSpeed's default for `path`, where it is a plain value (not a Rule)."""
    value = BY_PATH[path].deepspeed
    assert value is not UNSET and not isinstance(value, Rule), f"{path}: {value!r}"
    return value


def generated_default(path: str) -> Any:
    """What `zero-train config` writes for `path` when its flag is not given, where it is a plain value."""
    value = BY_PATH[path].generated
    assert value is not UNSET and not isinstance(value, Rule), f"{path}: {value!r}"
    return value


def flag_for(value_name: str) -> str:
    """The scripts/train.py flag that gives the value filling "auto" ("lr" -> "--lr"), "" if none does."""
    return next((key.flag for key in KEYS if key.fills == value_name and key.flag), "")
