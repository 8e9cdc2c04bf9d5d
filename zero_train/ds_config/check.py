"""`zero-train config check`: DeepSpeed's own config classes do the schema work; we add what they miss.

DeepSpeed validates `zero_optimization` with its pydantic DeepSpeedZeroConfig and the whole file with
DeepSpeedConfig, but silently ignores unknown top-level keys, checks the batch algebra only for the world
size of the process it runs in, and leaves "auto" to the HF Trainer. On top of DeepSpeed we check (in
zero_train.ds_config.rules, which every training run also runs, on every engine): misspelled keys
(did-you-mean), batch algebra for a given world size (with the arithmetic), cross-field rules, and "auto"
values nothing will fill.
"""

from __future__ import annotations

import copy
import logging

from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
from deepspeed.utils import logger
from pydantic import ValidationError

from zero_train.ds_config.auto import auto_keys, get_key
from zero_train.ds_config.keys import AUTO
from zero_train.ds_config.rules import CheckReport, check_rules, offload_device

__all__ = ["CheckReport", "check_config"]
STAGE_WORK = {
    0: "no ZeRO partitioning (plain data parallel)",
    1: "ZeRO-1: optimizer states partitioned across ranks",
    2: "ZeRO-2: optimizer states and gradients partitioned across ranks",
    3: "ZeRO-3: optimizer states, gradients and parameters partitioned across ranks",
}


def check_config(cfg: dict, *, world_size: int | None = None) -> CheckReport:
    """Validate a DeepSpeed config.

    Args:
        cfg: the config (may contain "auto").
        world_size: check train_batch_size for this many ranks (None: only what the file alone implies).

    Returns:
        A CheckReport; `problems` empty means DeepSpeed (after "auto" is filled) accepts it.
    """
    report = check_rules(cfg, world_size=world_size)
    if not report.problems:
        _check_zero_section(cfg, report)
    if not report.problems:
        _check_with_deepspeed(cfg, report)
    if not report.problems:
        _summarize(cfg, world_size, report)
    return report


def _check_zero_section(cfg: dict, report: CheckReport) -> None:
    """DeepSpeed's pydantic check of zero_optimization's values (its names were checked: rules)."""
    zero = cfg.get("zero_optimization", {})
    try:
        DeepSpeedZeroConfig(**zero)
    except ValidationError as err:
        for error in err.errors():
            where = ".".join(str(part) for part in error["loc"]) or "(section)"
            report.problems.append(f"zero_optimization.{where}: {error['msg']} (DeepSpeedZeroConfig)")
    except (ValueError, AssertionError, TypeError) as err:
        report.problems.append(f"zero_optimization: {_first_line(err)} (DeepSpeedZeroConfig)")


def _without_autos(node):
    if isinstance(node, dict):
        return {k: _without_autos(v) for k, v in node.items() if v != AUTO}
    return node


def _ds_ready_copy(cfg: dict) -> dict:
    """A copy DeepSpeedConfig can judge in any process: autos dropped, the batch per rank only (DeepSpeed derives
    train_batch_size with the world size it sees: 1 here, the group's in a rank of a launch whose DeepSpeed
    communication is already up, e.g. the bench worker's second DeepSpeed run). check_rules checks the
    user's train_batch_size against --world-size."""
    ready = _without_autos(copy.deepcopy(cfg))
    ready.pop("train_batch_size", None)
    ready.setdefault("train_micro_batch_size_per_gpu", 1)
    return ready


def _check_with_deepspeed(cfg: dict, report: CheckReport) -> None:
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        DeepSpeedConfig(_ds_ready_copy(cfg))
    except Exception as err:  # noqa: BLE001 - DeepSpeed raises ValueError, AssertionError, pydantic errors
        report.problems.append(f"DeepSpeed rejects the config: {_first_line(err)}")
    finally:
        logger.setLevel(level)


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or err.__class__.__name__
    return " ".join(text.split("\n")[:3])


def _summarize(cfg: dict, world_size: int | None, report: CheckReport) -> None:
    stage = get_key(cfg, "zero_optimization.stage") or 0
    lines = [STAGE_WORK.get(stage, f"stage {stage}")]
    precision = "fp16 (loss scaling)" if get_key(cfg, "fp16.enabled") is True else "fp32"
    if True in (get_key(cfg, "bf16.enabled"), get_key(cfg, "bfloat16.enabled")):
        precision = "bf16"
    lines.append(f"precision: {precision}")
    micro = cfg.get("train_micro_batch_size_per_gpu", "derived")
    accum = cfg.get("gradient_accumulation_steps", 1)
    total = cfg.get("train_batch_size", "micro x accum x world size, derived at launch")
    lines.append(f"batch: micro {micro} x accumulation {accum} per rank; train_batch_size {total}")
    if world_size is not None:
        lines.append(f"batch algebra checked for world size {world_size}")
    if isinstance(cfg.get("optimizer"), dict):
        params = cfg["optimizer"].get("params", {})
        lines.append(
            f"optimizer: {cfg['optimizer'].get('type')} " + ", ".join(f"{k}={v}" for k, v in params.items())
        )
    if isinstance(cfg.get("scheduler"), dict):
        params = cfg["scheduler"].get("params", {})
        lines.append(
            f"scheduler: {cfg['scheduler'].get('type')} " + ", ".join(f"{k}={v}" for k, v in params.items())
        )
    lines.append(f"gradient clipping: {cfg.get('gradient_clipping', '1.0 (DeepSpeed default)')}")
    offloads = [
        f"{k.split('_')[1]} -> {offload_device(cfg, k)}"
        for k in ("offload_optimizer", "offload_param")
        if offload_device(cfg, k) != "none"
    ]
    lines.append("offload: " + (", ".join(offloads) or "none"))
    autos = auto_keys(cfg)
    if autos:
        lines.append(
            f'"auto" ({len(autos)}, filled by the HF Trainer or scripts/train.py flags): ' + ", ".join(autos)
        )
    report.summary.extend(lines)
