"""`zero-train config check`: DeepSpeed's own config classes do the schema work; we add what they miss.

DeepSpeed validates `zero_optimization` with its pydantic DeepSpeedZeroConfig and the whole file with
DeepSpeedConfig, but silently ignores unknown top-level keys, checks the batch algebra only for the world
size of the process it runs in, and leaves "auto" to the HF Trainer. On top of DeepSpeed we check:
misspelled top-level keys (did-you-mean), batch algebra for a given world size (with the arithmetic),
cross-field rules, and "auto" values nothing will fill.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import logging
import pathlib
import re

import deepspeed
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
from deepspeed.utils import logger
from pydantic import ValidationError

from zero_train.ds_config.auto import auto_keys, get_key
from zero_train.ds_config.keys import AUTO, AUTO_KEYS
from zero_train.ds_config.parse import batch_triple
from zero_train.runtime.errors import UsageError

ZERO3_ONLY = re.compile(r"^(stage3_|offload_param$)")
STAGE_WORK = {
    0: "no ZeRO partitioning (plain data parallel)",
    1: "ZeRO-1: optimizer states partitioned across ranks",
    2: "ZeRO-2: optimizer states and gradients partitioned across ranks",
    3: "ZeRO-3: optimizer states, gradients and parameters partitioned across ranks",
}


@dataclasses.dataclass(kw_only=True, slots=True)
class CheckReport:
    """What `check_config` found."""

    problems: list[str] = dataclasses.field(default_factory=list)
    """Errors: DeepSpeed would fail, or train differently from what the file says."""
    warnings: list[str] = dataclasses.field(default_factory=list)
    """Settings DeepSpeed ignores at this stage (harmless, but misleading)."""
    summary: list[str] = dataclasses.field(default_factory=list)
    """What the config does, one line per topic."""

    def raise_if_invalid(self, path: str) -> None:
        """UsageError listing every problem (each printed as its own `error:` line), if there is any.

        A single problem is a single line (`<path>: <problem>`), as every other user error is.
        """
        if len(self.problems) == 1:
            raise UsageError(f"{path}: {self.problems[0]}")
        if self.problems:
            count = len(self.problems)
            raise UsageError(
                f"{path}: {count} problem{'s' * (count != 1)} found; fix them and run `zero-train config check` "
                "again",
                problems=self.problems,
            )


@functools.cache
def deepspeed_known_keys() -> frozenset[str]:
    """Every key name DeepSpeed's config code mentions (string literals in its config/constants modules)."""
    root = pathlib.Path(deepspeed.__file__).parent
    names: set[str] = set()
    for path in root.rglob("*.py"):
        if path.name in ("constants.py", "config.py", "config_utils.py"):
            names |= set(re.findall(r"""['"]([a-z][a-z0-9_]*)['"]""", path.read_text(encoding="utf-8")))
    return frozenset(names)


@functools.cache
def zero_field_names() -> frozenset[str]:
    """Field names and aliases of DeepSpeed's DeepSpeedZeroConfig (keys that belong in zero_optimization)."""
    fields = DeepSpeedZeroConfig.model_fields
    return frozenset(fields) | frozenset(f.alias for f in fields.values() if f.alias)


TOP_LEVEL_COMMON = (
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "optimizer", "scheduler", "fp16", "bf16", "zero_optimization", "steps_per_print", "wall_clock_breakdown",
    "zero_allow_untested_optimizer", "activation_checkpointing", "flops_profiler", "communication_data_type",
)  # fmt: skip


def check_config(cfg: dict, *, world_size: int | None = None) -> CheckReport:
    """Validate a DeepSpeed config.

    Args:
        cfg: the config (may contain "auto").
        world_size: check train_batch_size for this many ranks (None: only what the file alone implies).

    Returns:
        A CheckReport; `problems` empty means DeepSpeed (after "auto" is filled) accepts it.
    """
    report = CheckReport()
    _check_top_level_keys(cfg, report)
    _check_zero_section(cfg, report)
    _check_cross_fields(cfg, report)
    _check_autos(cfg, report)
    _check_batch(cfg, world_size, report)
    if not report.problems:
        _check_with_deepspeed(cfg, report)
    if not report.problems:
        _summarize(cfg, world_size, report)
    return report


def _check_top_level_keys(cfg: dict, report: CheckReport) -> None:
    known = deepspeed_known_keys()
    for key in cfg:
        if key in zero_field_names() and key not in TOP_LEVEL_COMMON:
            report.problems.append(f"top-level key {key!r} belongs inside zero_optimization; move it there")
        elif key in ("lr", "betas", "eps", "weight_decay", "momentum"):
            report.problems.append(f"top-level key {key!r} belongs inside optimizer.params; move it there")
        elif key not in known:
            guess = difflib.get_close_matches(key, list(TOP_LEVEL_COMMON) + sorted(known), n=1, cutoff=0.75)
            hint = f"did you mean {guess[0]!r}?" if guess else "remove it"
            report.problems.append(f"unknown top-level key {key!r} (DeepSpeed silently ignores it); {hint}")


def _check_zero_section(cfg: dict, report: CheckReport) -> None:
    zero = cfg.get("zero_optimization", {})
    if not isinstance(zero, dict):
        report.problems.append(f"zero_optimization must be a JSON object, got {zero!r}")
        return

    try:
        DeepSpeedZeroConfig(**zero)
    except ValidationError as err:
        for error in err.errors():
            where = ".".join(str(part) for part in error["loc"]) or "(section)"
            report.problems.append(f"zero_optimization.{where}: {error['msg']} (DeepSpeedZeroConfig)")
    except (ValueError, AssertionError, TypeError) as err:
        report.problems.append(f"zero_optimization: {_first_line(err)} (DeepSpeedZeroConfig)")


def _device(cfg: dict, key: str) -> str:
    value = get_key(cfg, f"zero_optimization.{key}.device")
    return value if isinstance(value, str) else "none"


def _check_cross_fields(cfg: dict, report: CheckReport) -> None:
    stage = get_key(cfg, "zero_optimization.stage") or 0
    if get_key(cfg, "fp16.enabled") is True and True in (
        get_key(cfg, "bf16.enabled"),
        get_key(cfg, "bfloat16.enabled"),
    ):
        report.problems.append("fp16.enabled and bf16.enabled are both true; enable only one precision")
    if _device(cfg, "offload_param") != "none" and stage != 3:
        report.problems.append(
            f"zero_optimization.offload_param needs stage 3 (stage is {stage}); set stage 3 or remove it"
        )
    optimizer_device = _device(cfg, "offload_optimizer")
    if optimizer_device != "none" and stage == 0:
        report.problems.append("zero_optimization.offload_optimizer needs stage 1, 2 or 3 (stage is 0)")
    if optimizer_device == "nvme" and stage in (1, 2):
        report.problems.append(
            f"offload_optimizer device nvme needs stage 3 (stage is {stage}); use device cpu"
        )
    for key in ("offload_optimizer", "offload_param"):
        if _device(cfg, key) == "nvme" and not get_key(cfg, f"zero_optimization.{key}.nvme_path"):
            report.problems.append(
                f"zero_optimization.{key} device nvme has no nvme_path; add the NVMe directory"
            )
    if isinstance(cfg.get("optimizer"), dict) and get_key(cfg, "optimizer.params.max_grad_norm") is not None:
        report.problems.append(
            "optimizer.params.max_grad_norm is rejected by DeepSpeed; use top-level gradient_clipping"
        )
    _check_scheduler(cfg, report)
    zero = cfg.get("zero_optimization", {})
    if isinstance(zero, dict) and isinstance(stage, int):
        ignored = [k for k in zero if ZERO3_ONLY.match(k)] if stage < 3 else []
        ignored += ["allgather_bucket_size"] if stage == 3 and "allgather_bucket_size" in zero else []
        ignored += [k for k in zero if k != "stage"] if stage == 0 else []
        for key in dict.fromkeys(ignored):
            if not (stage == 0 and key == "offload_optimizer"):
                report.warnings.append(f"zero_optimization.{key} is ignored at stage {stage}; remove it")
    lr, peak = get_key(cfg, "optimizer.params.lr"), get_key(cfg, "scheduler.params.warmup_max_lr")
    if lr not in (None, AUTO) and peak not in (None, AUTO) and lr != peak:
        report.warnings.append(
            f"optimizer.params.lr {lr} is overridden by scheduler.params.warmup_max_lr {peak}"
        )


def _check_scheduler(cfg: dict, report: CheckReport) -> None:
    if not isinstance(cfg.get("scheduler"), dict):
        return

    kind = get_key(cfg, "scheduler.type")
    if kind not in VALID_LR_SCHEDULES:
        report.problems.append(
            f"scheduler.type {kind!r} is not a DeepSpeed scheduler; use one of {', '.join(VALID_LR_SCHEDULES)}"
        )
    if (
        kind in ("WarmupDecayLR", "WarmupCosineLR")
        and get_key(cfg, "scheduler.params.total_num_steps") is None
    ):
        report.problems.append(f'scheduler {kind} needs params.total_num_steps; add it (or "auto")')
    steps = get_key(cfg, "scheduler.params.warmup_num_steps")
    if steps not in (None, AUTO) and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        report.problems.append(
            f"scheduler.params.warmup_num_steps must be a whole number >= 1, got {steps!r}"
        )
    warmup_type = get_key(cfg, "scheduler.params.warmup_type")
    if warmup_type is not None and warmup_type not in ("log", "linear"):
        report.problems.append(
            f"scheduler.params.warmup_type {warmup_type!r} is not log or linear (DeepSpeed would use log)"
        )


def _check_autos(cfg: dict, report: CheckReport) -> None:
    for key in auto_keys(cfg):
        if key not in AUTO_KEYS:
            report.problems.append(
                f'{key} is "auto" but neither the HF Trainer nor zero_train fills it; write a value'
            )


def _without_autos(node):
    if isinstance(node, dict):
        return {k: _without_autos(v) for k, v in node.items() if v != AUTO}
    return node


def _check_batch(cfg: dict, world_size: int | None, report: CheckReport) -> None:
    concrete = _without_autos(cfg)
    names = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    if not any(n in concrete for n in names):
        if not any(cfg.get(n) == AUTO for n in names):
            report.problems.append("no batch size: set train_micro_batch_size_per_gpu (or train_batch_size)")
        return
    if world_size is None and not (
        "train_batch_size" in concrete and "train_micro_batch_size_per_gpu" in concrete
    ):
        world_size = 1  # the file alone fixes nothing else; DeepSpeed derives the rest at launch
    if world_size is None:
        per_rank = concrete["train_micro_batch_size_per_gpu"] * concrete.get("gradient_accumulation_steps", 1)
        if isinstance(per_rank, int) and per_rank > 0 and isinstance(concrete["train_batch_size"], int):
            if concrete["train_batch_size"] % per_rank:
                report.problems.append(
                    f"train_batch_size {concrete['train_batch_size']} is not a multiple of micro batch x accumulation "
                    f"= {per_rank}: no world size fits; fix one of them"
                )
                return
            world_size = concrete["train_batch_size"] // per_rank
    try:
        batch_triple(concrete, world_size=world_size)
    except UsageError as err:
        report.problems.append(str(err))


def _ds_ready_copy(cfg: dict) -> dict:
    """A copy DeepSpeedConfig can judge in this (world size 1) process: autos dropped, batch per rank."""
    ready = _without_autos(copy.deepcopy(cfg))
    micro = ready.get("train_micro_batch_size_per_gpu")
    accum = ready.get("gradient_accumulation_steps", 1)
    ready.pop("train_batch_size", None)
    if micro is None:
        ready["train_micro_batch_size_per_gpu"] = 1
    if isinstance(ready.get("train_micro_batch_size_per_gpu"), int) and isinstance(accum, int):
        ready["train_batch_size"] = ready["train_micro_batch_size_per_gpu"] * accum
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
        f"{k.split('_')[1]} -> {_device(cfg, k)}"
        for k in ("offload_optimizer", "offload_param")
        if _device(cfg, k) != "none"
    ]
    lines.append("offload: " + (", ".join(offloads) or "none"))
    autos = auto_keys(cfg)
    if autos:
        lines.append(
            f'"auto" ({len(autos)}, filled by the HF Trainer or scripts/train.py flags): ' + ", ".join(autos)
        )
    report.summary.extend(lines)
