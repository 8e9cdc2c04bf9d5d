"""Filling "auto" values the way the Hugging Face Trainer does, and the config DeepSpeed finally sees.

The HF integration (transformers/integrations/deepspeed.py) replaces "auto" with a TrainingArguments value
and records a mismatch when a concrete value differs from the argument; we do the same with
`train_settings`' keyword arguments. One deliberate difference: a given argument also fills a key the config
leaves out (HF leaves it to DeepSpeed's default, so DeepSpeed would silently train with another value).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from zero_train.runtime.errors import UsageError

if TYPE_CHECKING:
    from zero_train.ds_config.settings import TrainSettings

AUTO = "auto"

# dotted key -> the value name that fills it (a train_settings argument or a value derived from them)
AUTO_KEYS = {
    "train_micro_batch_size_per_gpu": "micro_batch_size",
    "gradient_accumulation_steps": "grad_accum",
    "train_batch_size": "train_batch_size",
    "gradient_clipping": "grad_clip",
    "optimizer.params.lr": "lr",
    "optimizer.params.weight_decay": "weight_decay",
    "optimizer.params.betas": "betas",
    "optimizer.params.eps": "eps",
    "scheduler.params.warmup_min_lr": "warmup_min_lr",
    "scheduler.params.warmup_max_lr": "lr",
    "scheduler.params.warmup_num_steps": "warmup_steps",
    "scheduler.params.total_num_steps": "total_steps",
    "fp16.enabled": "fp16",
    "bf16.enabled": "bf16",
    "zero_optimization.reduce_bucket_size": "reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold": "stage3_param_persistence_threshold",
}

# The HF Trainer's defaults for values no argument gave (TrainingArguments defaults).
HF_DEFAULTS = {
    "grad_accum": 1,
    "grad_clip": 1.0,
    "weight_decay": 0.0,
    "betas": [0.9, 0.999],
    "eps": 1e-8,
    "warmup_min_lr": 0,
    "fp16": False,
    "bf16": False,
}

# Where a missing key is filled too (it is left out of the config, but a value was given).
ABSENT_FILLED = {
    "train_micro_batch_size_per_gpu": None,
    "gradient_accumulation_steps": None,
    "gradient_clipping": None,
    "optimizer.params.lr": ("AdamW", "Adam", "SGD", "adamw", "adam", "sgd"),
    "optimizer.params.weight_decay": ("AdamW", "Adam", "SGD", "adamw", "adam", "sgd"),
    "scheduler.params.warmup_max_lr": ("WarmupLR", "WarmupDecayLR"),
    "scheduler.params.warmup_num_steps": ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"),
    "scheduler.params.total_num_steps": ("WarmupDecayLR", "WarmupCosineLR"),
}

# Filled when "auto" but never compared (HF's fill_only; precision is compared as a whole).
FILL_ONLY = {
    "fp16",
    "bf16",
    "reduce_bucket_size",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
}

# How to tell the user which flag fills a value.
FLAGS = {
    "micro_batch_size": "--micro-batch-size",
    "grad_accum": "--grad-accum",
    "train_batch_size": "--micro-batch-size and --grad-accum",
    "grad_clip": "--grad-clip",
    "lr": "--lr",
    "weight_decay": "--weight-decay",
    "warmup_steps": "--warmup-steps",
    "total_steps": "--max-steps",
    "fp16": "--precision",
    "bf16": "--precision",
    "reduce_bucket_size": "--model (its hidden size)",
    "stage3_prefetch_bucket_size": "--model (its hidden size)",
    "stage3_param_persistence_threshold": "--model (its hidden size)",
}


def get_key(cfg: dict, dotted: str) -> Any:
    """The value at a dotted key ("optimizer.params.lr"), None if any part is missing."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _set_key(cfg: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _absent_fillable(cfg: dict, dotted: str) -> bool:
    if dotted not in ABSENT_FILLED or get_key(cfg, dotted) is not None:
        return False
    types = ABSENT_FILLED[dotted]
    return types is None or get_key(cfg, dotted.split(".")[0] + ".type") in types


def derived_values(given: dict, *, world_size: int) -> dict:
    """Values for every AUTO_KEYS name that `given` (train_settings' arguments) determines."""
    values = {k: v for k, v in given.items() if k not in ("precision", "hidden_size")}
    if "warmup_steps" in values:
        values["warmup_steps"] = max(1, values["warmup_steps"])  # DeepSpeed rejects 0 warmup steps (as HF)
    if given.get("precision") is not None:
        values["fp16"] = given["precision"] == "fp16"
        values["bf16"] = given["precision"] == "bf16"
    hidden = given.get("hidden_size")
    if hidden is not None:
        values["reduce_bucket_size"] = hidden * hidden
        values["stage3_prefetch_bucket_size"] = int(0.9 * hidden * hidden)
        values["stage3_param_persistence_threshold"] = 10 * hidden
    return values


def fill_auto(cfg: dict, given: dict, *, world_size: int) -> dict:
    """A copy of `cfg` with "auto" (and keys left out, where a value was given) filled from `given`.

    Args:
        cfg: the user's config.
        given: train_settings' keyword arguments that were given (not None).
        world_size: number of ranks (for train_batch_size).

    Returns:
        The filled copy.

    Raises:
        UsageError: a concrete value disagrees with a given argument, or an "auto" nothing fills.
    """
    values = derived_values(given, world_size=world_size)
    _check_conflicts(cfg, values, given)
    filled = copy.deepcopy(cfg)
    for dotted, name in AUTO_KEYS.items():
        if name == "train_batch_size":
            continue
        current = get_key(filled, dotted)
        if current == AUTO or (name in values and _absent_fillable(filled, dotted)):
            if name in values:
                _set_key(filled, dotted, values[name])
            elif current == AUTO and name in HF_DEFAULTS:
                _set_key(filled, dotted, copy.copy(HF_DEFAULTS[name]))
    _fill_precision_sections(filled, given.get("precision"))
    _fill_train_batch_size(filled, world_size)
    _require_no_auto(filled)
    return filled


def _check_conflicts(cfg: dict, values: dict, given: dict) -> None:
    for dotted, name in AUTO_KEYS.items():
        current = get_key(cfg, dotted)
        if name not in values or current is None or current == AUTO or name in FILL_ONLY:
            continue
        expected = values[name]
        if current != expected and not (isinstance(current, list) and list(expected) == current):
            flag = FLAGS.get(name, name)
            raise UsageError(
                f"config {dotted}={current!r} disagrees with {name}={expected!r} ({flag}); "
                f'set {dotted} to "auto" or make them equal'
            )
    precision = given.get("precision")
    if precision is not None:
        from zero_train.ds_config.parse import precision_of

        concrete = {k: v for k, v in cfg.items() if k not in ("fp16", "bf16", "bfloat16")}
        for key in ("fp16", "bf16", "bfloat16"):
            block = cfg.get(key)
            if isinstance(block, dict) and block.get("enabled") != AUTO:
                concrete[key] = block
        config_precision = precision_of(concrete)
        any_auto = any(get_key(cfg, f"{k}.enabled") == AUTO for k in ("fp16", "bf16"))
        if config_precision != precision and not (config_precision == "fp32" and any_auto):
            raise UsageError(
                f"config precision {config_precision} (fp16.enabled / bf16.enabled) disagrees with "
                f'precision={precision!r} (--precision); set the "enabled" keys to "auto" or make them equal'
            )


def _fill_precision_sections(filled: dict, precision: str | None) -> None:
    """A given precision whose section is missing adds it (fp32 adds nothing)."""
    if precision in ("fp16", "bf16") and get_key(filled, f"{precision}.enabled") is not True:
        if not (precision == "bf16" and get_key(filled, "bfloat16.enabled") is True):
            filled.setdefault(precision, {})["enabled"] = True


def _fill_train_batch_size(filled: dict, world_size: int) -> None:
    micro = filled.get("train_micro_batch_size_per_gpu")
    accum = filled.get("gradient_accumulation_steps", 1)
    if filled.get("train_batch_size") == AUTO:
        if isinstance(micro, int) and isinstance(accum, int):
            filled["train_batch_size"] = micro * accum * world_size
        else:
            del filled["train_batch_size"]  # DeepSpeed derives it from the other two


def auto_keys(cfg: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose value is "auto", in document order."""
    if not isinstance(cfg, dict):
        return []
    found = []
    for key, value in cfg.items():
        dotted = f"{prefix}{key}"
        if value == AUTO:
            found.append(dotted)
        found.extend(auto_keys(value, f"{dotted}."))
    return found


def _require_no_auto(filled: dict) -> None:
    left = auto_keys(filled)
    if left:
        hints = [f"{key} (pass {FLAGS.get(AUTO_KEYS.get(key, ''), 'a concrete value')})" for key in left]
        raise UsageError(
            f'"auto" values nothing fills: {", ".join(hints)}; give those flags or write numbers'
        )


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
    given = dict(
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
    values = derived_values({k: v for k, v in given.items() if v is not None}, world_size=settings.world_size)
    resolved = copy.deepcopy(cfg)
    for dotted, name in AUTO_KEYS.items():
        if name in values and (get_key(resolved, dotted) == AUTO or _absent_fillable(resolved, dotted)):
            _set_key(resolved, dotted, values[name])
    _fill_precision_sections(resolved, settings.precision)
    if resolved.get("train_batch_size", AUTO) == AUTO:
        resolved["train_batch_size"] = settings.train_batch_size
    _require_no_auto(resolved)
    return resolved
