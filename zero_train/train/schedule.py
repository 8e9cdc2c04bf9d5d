"""The run's optimizer settings and lr schedule: which apply, where each came from, and a resume that re-plans.

The HF Trainer's rule: a DeepSpeed config's scheduler block sets the schedule; without one, `--lr-scheduler-type`
does (linear by default), with `--warmup-steps` or `--warmup-ratio` (0 by default), decaying to 0 at the run's
last step. train.py applies it to pretrained weights (a folder or hub id) and wherever `--lr-scheduler-type` is
given; a preset trained from random weights keeps train.py's warmup + cosine (no config) or the config's constant
lr (a config without a scheduler block: DeepSpeed's meaning).

    settings = run_schedule(settings, config=config, cfg=cfg, pretrained=True, max_steps=100)
    settings_line(config, cfg, settings, source="ds.json", pretrained=True)   # the run's second line
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

from zero_train.ds_config.auto import get_key
from zero_train.ds_config.keys import AUTO, HF_SCHEDULERS
from zero_train.ds_config.schedule import hf_lambda
from zero_train.runtime.errors import UsageError
from zero_train.train.config import RunConfig

DECAYING = ("warmup_linear", "warmup_cosine", "linear", "cosine")
"""Schedules whose curve depends on the run's horizon (total_steps)."""


def uses_run_schedule(config: RunConfig, cfg: dict, *, pretrained: bool) -> bool:
    """Whether the run's flags set the schedule (no scheduler block; pretrained weights or the flag given)."""
    given = config.optimizer.lr_scheduler_type
    if given is not None and "scheduler" in cfg:
        kind = get_key(cfg, "scheduler.type")
        raise UsageError(
            f"--lr-scheduler-type {given}: the DeepSpeed config's scheduler block ({kind}) sets the schedule, "
            "as in the HF Trainer; drop the flag or the config's scheduler block"
        )
    warmup = config.optimizer.warmup_steps or config.optimizer.warmup_ratio  # a warmup asks for a schedule
    return "scheduler" not in cfg and (pretrained or given is not None or bool(warmup))


def warmup_steps(config: RunConfig, max_steps: int) -> int | None:
    """--warmup-steps, else --warmup-ratio's steps (ceil(ratio x steps), as the HF Trainer), else None."""
    optimizer = config.optimizer
    if optimizer.warmup_steps is not None:
        return optimizer.warmup_steps
    if optimizer.warmup_ratio is not None:
        if optimizer.warmup_ratio >= 1:
            raise UsageError(
                f"--warmup-ratio {optimizer.warmup_ratio} is not below 1; give a fraction in [0, 1)"
            )
        return math.ceil(optimizer.warmup_ratio * max_steps)
    return None


def run_schedule(settings, *, config: RunConfig, cfg: dict, pretrained: bool, max_steps: int):
    """The settings with the run's HF-style schedule when it applies (uses_run_schedule), else unchanged."""
    if not uses_run_schedule(config, cfg, pretrained=pretrained):
        return settings
    kind = config.optimizer.lr_scheduler_type or "linear"
    warmup = warmup_steps(config, max_steps) or 0
    if kind == "constant" and warmup:
        raise UsageError(
            f"--lr-scheduler-type constant has no warmup; use constant_with_warmup for {warmup} warmup steps"
        )
    if warmup > max_steps:
        raise UsageError(f"--warmup-steps {warmup} exceeds the run's {max_steps} steps; lower it")
    return dataclasses.replace(
        settings,
        scheduler=kind,
        warmup_steps=warmup,
        total_steps=max_steps if kind != "constant" else None,
        warmup_type="linear",
        warmup_min_lr=0.0,
        warmup_min_ratio=0.0,
        min_lr_ratio=0.0,
    )


def resumed_schedule(settings, *, saved: dict, step: int, ckpt: pathlib.Path):
    """The schedule of a run resumed at `step` from a checkpoint whose settings were `saved` (its run.json).

    The same horizon: unchanged. Another horizon: an HF schedule decays from the lr it reached to 0 at the new
    horizon (no jump); a DeepSpeed scheduler cannot be re-planned, so the run is refused in one line.
    """
    old_total = saved.get("total_steps")
    if old_total == settings.total_steps or saved.get("scheduler") not in DECAYING:
        return settings
    kind = saved["scheduler"]
    if kind not in HF_SCHEDULERS or kind != settings.scheduler:
        raise UsageError(
            f"checkpoint {ckpt} follows a {kind} schedule that ends at step {old_total}, this run's ends at "
            f"{settings.total_steps}: DeepSpeed's schedulers cannot be re-planned; resume with --max-steps "
            f"{old_total}, or start from an export with --lr-scheduler-type"
        )
    replan = saved.get("replan_from")
    before = dataclasses.replace(
        settings,
        total_steps=old_total,
        warmup_steps=saved.get("warmup_steps", 0),
        replan_from=tuple(replan) if replan else None,
    )
    reached = hf_lambda(before, step)
    if reached <= 0:
        raise UsageError(
            f"checkpoint {ckpt} finished its {kind} schedule (lr 0 at step {step}); to train on, start a new "
            "run from its export (zero-train export, then --model DIR)"
        )
    return dataclasses.replace(settings, replan_from=(step, reached))


def settings_line(config: RunConfig, cfg: dict, settings, *, source: str, pretrained: bool) -> str:
    """The run's optimizer settings and schedule, each with where it came from (flag, config, default)."""
    optimizer = config.optimizer
    in_config = not source.startswith("generated")
    default = "default: the HF Trainer's" if pretrained else "default: train.py's, from random weights"

    def origin(flag: str, given, *paths: str, fallback: str = "default: the HF Trainer's") -> str:
        if given is not None:
            return flag
        for path in paths:
            value = get_key(cfg, path)
            if in_config and value is not None and value != AUTO:
                return f"config {source}"
        return fallback

    lr_from = origin(
        "--lr", optimizer.lr, "optimizer.params.lr", "scheduler.params.warmup_max_lr", fallback=default
    )
    parts = [
        f"optimizer {settings.optimizer}: lr {settings.lr:g} ({lr_from})",
        f"weight decay {settings.weight_decay:g} ("
        + origin("--weight-decay", optimizer.weight_decay, "optimizer.params.weight_decay")
        + ")",
        f"grad clip {settings.grad_clip:g} ("
        + origin("--max_grad_norm", optimizer.grad_clip, "gradient_clipping")
        + ")",
        f"schedule {describe_schedule(settings)} ({schedule_origin(config, cfg, source=source, default=default)})",
    ]
    return " | ".join(parts)


def schedule_origin(config: RunConfig, cfg: dict, *, source: str, default: str) -> str:
    """Where the schedule came from: the flags, the config's scheduler block, or a default."""
    optimizer = config.optimizer
    flags = [
        name
        for name, value in (
            ("--lr-scheduler-type", optimizer.lr_scheduler_type),
            ("--warmup-steps", optimizer.warmup_steps),
            ("--warmup-ratio", optimizer.warmup_ratio),
        )
        if value is not None
    ]
    if "scheduler" in cfg and not source.startswith("generated"):
        flags.insert(0, f"config {source}")
    return ", ".join(flags) if flags else default


def describe_schedule(settings) -> str:
    """The schedule in words: its kind, warmup and horizon."""
    kind = settings.scheduler
    if kind == "constant":
        return "constant"
    warmup = f"warmup {settings.warmup_steps}"
    if kind in ("warmup_linear", "warmup_cosine", "warmup_constant"):
        warmup = f"DeepSpeed's {warmup} ({settings.warmup_type}, at least 2)"
    shape = {
        "linear": "linear decay to 0",
        "cosine": "cosine decay to 0",
        "constant_with_warmup": "constant",
        "warmup_linear": "linear decay (WarmupDecayLR)",
        "warmup_cosine": "cosine decay (WarmupCosineLR)",
        "warmup_constant": "constant (WarmupLR)",
    }[kind]
    horizon = f" at step {settings.total_steps}" if settings.total_steps is not None else ""
    replanned = f", re-planned from step {settings.replan_from[0]}" if settings.replan_from else ""
    return f"{shape}{horizon}, {warmup}{replanned}"
