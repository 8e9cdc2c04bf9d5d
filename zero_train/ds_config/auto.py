"""Filling "auto" values the way the Hugging Face Trainer does, and the config DeepSpeed finally sees.

The HF integration (transformers/integrations/deepspeed.py) replaces "auto" with a TrainingArguments value
and records a mismatch when a concrete value differs from the argument; we do the same with
`train_settings`' keyword arguments. One deliberate difference: a given argument also fills a key the config
leaves out (HF leaves it to DeepSpeed's default, so DeepSpeed would silently train with another value).
Which key takes which value, and every default, is one row of zero_train.ds_config.keys.KEYS.
"""

from __future__ import annotations

import copy
from typing import Any

from zero_train.ds_config.keys import AUTO, AUTO_KEYS, KEYS, UNSET, ConfigKey, flag_for
from zero_train.ds_config.parse import precision_of
from zero_train.runtime.errors import UsageError


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


def _absent_fillable(cfg: dict, key: ConfigKey) -> bool:
    if key.fill_absent is False or get_key(cfg, key.path) is not None:
        return False
    return key.fill_absent is True or get_key(cfg, key.path.split(".")[0] + ".type") in key.fill_absent


def _derived_values(given: dict) -> dict:
    """Values for every "auto"-filling name (ConfigKey.fills) that `given` determines."""
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


def fill_config(cfg: dict, given: dict, *, world_size: int, compare: bool = True) -> dict:
    """A copy of `cfg` with "auto" (and keys left out, where a value was given) filled from `given`.

    The one pass over zero_train.ds_config.keys.KEYS: an "auto" gets the given value, else the HF Trainer's
    default; a key the config leaves out gets a given value where the table says so (ConfigKey.fill_absent);
    a missing precision section is added; train_batch_size is derived from the other two batch keys.

    Args:
        cfg: the user's config (not modified).
        given: values by ConfigKey.fills name that were given (no None): train_settings' arguments, or
            every value of a TrainSettings (resolve_auto).
        world_size: number of ranks (for train_batch_size).
        compare: refuse a concrete value that disagrees with a given one (False when `given` was read
            from this very config, as in resolve_auto).

    Returns:
        The filled copy (no "auto" left).

    Raises:
        UsageError: a concrete value disagrees with a given argument, or an "auto" nothing fills.
    """
    values = _derived_values(given)
    if compare:
        _check_conflicts(cfg, values, given)
    filled = copy.deepcopy(cfg)
    for key in KEYS:
        if key.fills is None or key.fills == "train_batch_size":
            continue
        current = get_key(filled, key.path)
        if current == AUTO or (key.fills in values and _absent_fillable(filled, key)):
            if key.fills in values:
                _set_key(filled, key.path, values[key.fills])
            elif current == AUTO and key.hf is not UNSET:
                _set_key(filled, key.path, copy.copy(key.hf))
    _fill_precision_sections(filled, given.get("precision"))
    _fill_train_batch_size(filled, world_size)
    _require_no_auto(filled)
    return filled


def _check_conflicts(cfg: dict, values: dict, given: dict) -> None:
    for key in KEYS:
        current = get_key(cfg, key.path)
        if key.fills not in values or current is None or current == AUTO or not key.compared:
            continue
        expected = values[key.fills]
        if current != expected and not (isinstance(current, list) and list(expected) == current):
            raise UsageError(
                f"config {key.path}={current!r} disagrees with {key.fills}={expected!r} "
                f'({flag_for(key.fills) or key.fills}); set {key.path} to "auto" or make them equal'
            )
    precision = given.get("precision")
    if precision is not None:
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
    """An "auto" or missing train_batch_size becomes micro * accumulation * world size when both are known."""
    if filled.get("train_batch_size", AUTO) != AUTO:
        return
    micro = filled.get("train_micro_batch_size_per_gpu")
    accum = filled.get("gradient_accumulation_steps", 1)
    if isinstance(micro, int) and isinstance(accum, int):
        filled["train_batch_size"] = micro * accum * world_size
    else:
        filled.pop("train_batch_size", None)  # DeepSpeed derives it from the other two


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
        hints = [f"{key} (pass {flag_for(AUTO_KEYS.get(key, '')) or 'a concrete value'})" for key in left]
        raise UsageError(
            f'"auto" values nothing fills: {", ".join(hints)}; give those flags or write numbers'
        )
