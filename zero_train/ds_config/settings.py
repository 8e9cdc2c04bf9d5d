"""TrainSettings: what every engine (DeepSpeed, our ZeRO-1, DDP, torch-zero) reads from one DeepSpeed JSON.

`train_settings(cfg, world_size=..., ...)` fills "auto" values from its keyword arguments the way the Hugging
Face Trainer does (transformers/integrations/deepspeed.py, `fill_match`), refuses a concrete value that
disagrees with an explicitly given argument, checks the batch algebra for the world size, and applies
DeepSpeed's defaults for everything the config leaves out (e.g. gradient_clipping defaults to 1.0).
`resolve_auto(cfg, settings)` then gives the config DeepSpeed itself should see. Both go through the one fill
pass (zero_train.ds_config.auto.fill_config) over the one table of keys and defaults (zero_train.ds_config.keys).
"""

from __future__ import annotations

import dataclasses
import warnings

from zero_train.ds_config.auto import fill_config
from zero_train.ds_config.keys import HF_SCHEDULERS, PRECISIONS, deepspeed_default
from zero_train.ds_config.parse import batch_triple, optimizer_fields, precision_of, scheduler_fields, section
from zero_train.runtime.errors import UsageError

OPTIMIZERS = ("adamw", "adam", "sgd")
DS_SCHEDULERS = ("constant", "warmup_constant", "warmup_linear", "warmup_cosine")
"""DeepSpeed's schedules (a config's scheduler block; none: constant)."""
SCHEDULERS = (*DS_SCHEDULERS, *HF_SCHEDULERS)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class TrainSettings:
    """The training recipe a DeepSpeed config describes, in engine-neutral terms."""

    zero_stage: int = 0
    """ZeRO stage 0..3 (zero_optimization.stage)."""
    precision: str = "fp32"
    """"fp32", "bf16" or "fp16" (fp16.enabled / bf16.enabled)."""
    micro_batch_size: int
    """Sequences per rank per micro-step (train_micro_batch_size_per_gpu)."""
    grad_accum: int
    """Micro-steps per optimizer step (gradient_accumulation_steps)."""
    world_size: int
    """Number of data-parallel ranks."""
    train_batch_size: int
    """Sequences per optimizer step over all ranks: micro_batch_size * grad_accum * world_size."""
    optimizer: str = "adamw"
    """"adamw", "adam" or "sgd" (DeepSpeed's type "Adam" is AdamW unless adam_w_mode is false)."""
    lr: float = 1e-3
    """Peak learning rate (the scheduler's warmup_max_lr when it has one, else optimizer.params.lr)."""
    weight_decay: float = 0.0
    """Weight decay (decoupled for adamw)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    eps: float = 1e-8
    """Adam epsilon."""
    momentum: float = 0.0
    """SGD momentum (sgd only)."""
    scheduler: str = "constant"
    """"constant" (no scheduler), "warmup_constant" (WarmupLR), "warmup_linear" (WarmupDecayLR),
    "warmup_cosine" (WarmupCosineLR); or the HF Trainer's "linear", "cosine", "constant_with_warmup"."""
    warmup_steps: int = 0
    """warmup_num_steps as written (DeepSpeed clamps it to >= 2 when it computes the schedule)."""
    warmup_type: str = "log"
    """"log" or "linear": how warmup rises (DeepSpeed's default is log)."""
    warmup_min_lr: float = 0.0
    """Learning rate at the start of warmup (WarmupCosineLR: lr * warmup_min_ratio)."""
    warmup_min_ratio: float = 0.0
    """Start of warmup as a fraction of lr (WarmupCosineLR's own parameter; informative otherwise)."""
    total_steps: int | None = None
    """Decay horizon in optimizer steps (total_num_steps) for warmup_linear / warmup_cosine."""
    min_lr_ratio: float = 1.0
    """Floor after decay as a fraction of lr (cosine: cos_min_ratio; linear: warmup_min_lr / lr)."""
    replan_from: tuple[int, float] | None = None
    """An HF schedule resumed with another horizon: (the resumed step, its lr multiplier); from there it decays to
    0 at total_steps (zero_train.ds_config.schedule.hf_lambda)."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0.0 = off (DeepSpeed's default is 1.0)."""
    fp16_loss_scale: float = 0.0
    """Static fp16 loss scale; 0.0 = dynamic loss scaling."""
    fp16_initial_scale_power: int = 16
    """Dynamic loss scaling starts at 2**this."""
    fp16_loss_scale_window: int = 1000
    """Overflow-free steps before the loss scale is doubled."""
    fp16_hysteresis: int = 2
    """Overflows tolerated before the loss scale is halved."""
    fp16_min_loss_scale: float = 1.0
    """The loss scale never drops below this."""
    offload_optimizer: str = "none"
    """Where optimizer states live: "none", "cpu" or "nvme" (DeepSpeed engine only)."""
    offload_param: str = "none"
    """Where parameters live between uses: "none", "cpu" or "nvme" (ZeRO-3, DeepSpeed engine only)."""
    hidden_size: int | None = None
    """Model hidden size, used to fill hidden-size-based "auto" bucket sizes (None if not known)."""

    def __post_init__(self):
        _require_choice("precision", self.precision, PRECISIONS)
        _require_choice("optimizer", self.optimizer, OPTIMIZERS)
        _require_choice("scheduler", self.scheduler, SCHEDULERS)
        _require_choice("warmup_type", self.warmup_type, ("log", "linear"))
        _require_choice("offload_optimizer", self.offload_optimizer, OFFLOAD_DEVICES)
        _require_choice("offload_param", self.offload_param, OFFLOAD_DEVICES)
        if self.zero_stage not in (0, 1, 2, 3):
            raise UsageError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        for name in ("micro_batch_size", "grad_accum", "world_size", "train_batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UsageError(f"{name} must be a whole number >= 1, got {getattr(self, name)!r}")
        product = self.micro_batch_size * self.grad_accum * self.world_size
        if self.train_batch_size != product:
            raise UsageError(
                f"train_batch_size {self.train_batch_size} != micro_batch_size {self.micro_batch_size} * "
                f"grad_accum {self.grad_accum} * world_size {self.world_size} = {product}"
            )
        if (
            self.scheduler in ("warmup_linear", "warmup_cosine", "linear", "cosine")
            and self.total_steps is None
        ):
            raise UsageError(
                f"scheduler {self.scheduler} needs total_steps (scheduler.params.total_num_steps)"
            )
        if self.offload_param != "none" and self.zero_stage != 3:
            raise UsageError(
                f"offload_param={self.offload_param!r} needs ZeRO stage 3 (zero_stage is {self.zero_stage})"
            )
        if self.lr < 0 or self.grad_clip < 0 or self.weight_decay < 0:
            raise UsageError("lr, grad_clip and weight_decay must be >= 0")


def _require_choice(name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise UsageError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


def train_settings(
    cfg: dict,
    *,
    world_size: int,
    micro_batch_size: int | None = None,
    grad_accum: int | None = None,
    lr: float | None = None,
    weight_decay: float | None = None,
    warmup_steps: int | None = None,
    total_steps: int | None = None,
    grad_clip: float | None = None,
    precision: str | None = None,
    hidden_size: int | None = None,
) -> TrainSettings:
    """The settings every engine trains with, read from a DeepSpeed config.

    Like the Hugging Face Trainer: an "auto" value is filled from the matching keyword argument (or the
    Trainer's default where it has one: betas, eps, warmup_min_lr, weight_decay, grad_clip, grad_accum,
    precision); a concrete value that disagrees with an explicitly given argument is an error.

    Args:
        cfg: the DeepSpeed config (not modified).
        world_size: number of data-parallel ranks.
        micro_batch_size, grad_accum, lr, weight_decay, warmup_steps, total_steps, grad_clip, precision:
            command-line values; None = not given.
        hidden_size: the model's hidden size, for "auto" bucket sizes (reduce h*h, prefetch 0.9*h*h,
            persistence 10*h).

    Returns:
        The resolved TrainSettings.

    Raises:
        UsageError: a conflict, an "auto" nothing fills, inconsistent batch sizes (with the arithmetic),
            or a value no engine can use.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise UsageError(f"world_size must be a whole number >= 1, got {world_size!r}")
    given = dict(
        micro_batch_size=micro_batch_size,
        grad_accum=grad_accum,
        lr=lr,
        weight_decay=weight_decay,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        grad_clip=grad_clip,
        precision=precision,
        hidden_size=hidden_size,
    )
    if warmup_steps and "scheduler" not in cfg:  # 0 asks for no warmup, which a constant lr has
        warnings.warn(
            f"warmup_steps={warmup_steps} is not used: the config has no scheduler section (constant lr); "
            "generate one with `zero-train config --warmup-steps N --max-steps M`",
            stacklevel=2,
        )
    filled = fill_config(cfg, {k: v for k, v in given.items() if v is not None}, world_size=world_size)
    settings = settings_from_config(filled, world_size=world_size, hidden_size=hidden_size)
    if warmup_steps == 0 and _warms_up(settings):
        start = (
            "warmup_min_ratio 1.0"
            if settings.scheduler == "warmup_cosine"
            else "warmup_min_lr equal to the lr"
        )
        warnings.warn(
            f"warmup_steps=0 still warms up: DeepSpeed's {cfg['scheduler']['type']} takes at least 2 warmup "
            f"steps and this config starts them below the peak; give scheduler.params {start} for none",
            stacklevel=2,
        )
    return settings


def _warms_up(settings: TrainSettings) -> bool:
    """Whether the schedule's warmup starts below its peak lr."""
    if settings.scheduler == "warmup_cosine":
        return settings.warmup_min_ratio < 1.0
    return settings.scheduler != "constant" and settings.warmup_min_lr < settings.lr


def settings_from_config(cfg: dict, *, world_size: int, hidden_size: int | None = None) -> TrainSettings:
    """TrainSettings from a config without "auto" values, with DeepSpeed's defaults for missing keys."""
    micro, accum, total = batch_triple(cfg, world_size=world_size)
    zero = section(cfg, "zero_optimization")
    fp16 = section(cfg, "fp16")
    optimizer = optimizer_fields(cfg)
    schedule = scheduler_fields(cfg, optimizer_lr=optimizer["lr"])
    if schedule.pop("overrides_optimizer_lr") and "optimizer" in cfg and optimizer["lr"] != schedule["lr"]:
        warnings.warn(
            f"optimizer.params.lr={optimizer['lr']} is not used: DeepSpeed's {cfg['scheduler']['type']} sets "
            f"the lr from scheduler.params.warmup_max_lr={schedule['lr']}; make them equal",
            stacklevel=3,
        )
    optimizer.pop("lr")
    return TrainSettings(
        zero_stage=zero.get("stage", deepspeed_default("zero_optimization.stage")),
        precision=precision_of(cfg),
        micro_batch_size=micro,
        grad_accum=accum,
        world_size=world_size,
        train_batch_size=total,
        **optimizer,
        **schedule,
        grad_clip=float(cfg.get("gradient_clipping", deepspeed_default("gradient_clipping"))),
        fp16_loss_scale=float(fp16.get("loss_scale", deepspeed_default("fp16.loss_scale"))),
        fp16_initial_scale_power=fp16.get(
            "initial_scale_power", deepspeed_default("fp16.initial_scale_power")
        ),
        fp16_loss_scale_window=fp16.get("loss_scale_window", deepspeed_default("fp16.loss_scale_window")),
        fp16_hysteresis=fp16.get("hysteresis", deepspeed_default("fp16.hysteresis")),
        fp16_min_loss_scale=float(fp16.get("min_loss_scale", deepspeed_default("fp16.min_loss_scale"))),
        offload_optimizer=_offload_device(zero, "offload_optimizer"),
        offload_param=_offload_device(zero, "offload_param"),
        hidden_size=hidden_size,
    )


def _offload_device(zero: dict, key: str) -> str:
    block = zero.get(key)
    if block is None:
        return "none"
    if not isinstance(block, dict):
        raise UsageError(f'zero_optimization.{key} must be an object like {{"device": "cpu"}}, got {block!r}')
    return str(block.get("device", "none"))


def resolve_auto(cfg: dict, settings: TrainSettings) -> dict:
    """A copy of `cfg` with every "auto" replaced by the value `settings` uses, ready for deepspeed.initialize.

    Keys the settings were given for but the config left out are filled too, so DeepSpeed trains with
    exactly `settings`.

    Args:
        cfg: the config `settings` came from.
        settings: from `train_settings(cfg, ...)`.

    Returns:
        The resolved config (no "auto" left).
    """
    # Field by field, the shape of cli/bench.py's bench_meta and cli/gpu_check.py's Options: other records.
    values = dict(
        micro_batch_size=settings.micro_batch_size,
        grad_accum=settings.grad_accum,
        grad_clip=settings.grad_clip,
        lr=settings.lr,
        weight_decay=settings.weight_decay,
        betas=list(settings.betas),
        eps=settings.eps,
        warmup_min_lr=settings.warmup_min_lr,
        warmup_steps=settings.warmup_steps,
        total_steps=settings.total_steps,
        precision=settings.precision,
        hidden_size=settings.hidden_size,
    )
    given = {name: value for name, value in values.items() if value is not None}
    return fill_config(cfg, given, world_size=settings.world_size, compare=False)
