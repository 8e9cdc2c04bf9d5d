"""The learning-rate schedule as a pure function, identical to DeepSpeed's schedulers and the HF Trainer's.

DeepSpeed builds WarmupLR / WarmupDecayLR / WarmupCosineLR with `last_batch_iteration=-1` (which already
sets the optimizer's lr) and calls `scheduler.step()` after every applied optimizer step. So the k-th applied
step (k = 0, 1, ...) runs with the lr of iteration k - 1: step 0 with the "not started" value (warmup_min_lr,
or 0 for WarmupCosineLR), step k >= 1 with iteration k - 1. `lr_at` reproduces that float for float
(same operations in the same order), so engines without DeepSpeed follow the same curve.
Source: deepspeed/runtime/lr_schedules.py (deepspeed 0.19.8).

The HF Trainer's schedules (`--lr-scheduler-type`, for a config without a scheduler block) are LambdaLRs: the k-th
applied step runs with lr * lambda(k), so the first step of a schedule without warmup runs at the peak, which
no DeepSpeed scheduler does (each starts its first step at warmup_min_lr, WarmupCosineLR at 0).
Source: transformers/optimization.py (get_linear_schedule_with_warmup, get_cosine_schedule_with_warmup,
get_constant_schedule_with_warmup). A resumed run whose horizon moved (`replan_from`) decays from the lr it
reached to 0 at the new horizon, instead of jumping to where the new curve would be.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from zero_train.ds_config.keys import HF_SCHEDULERS

if TYPE_CHECKING:
    from zero_train.ds_config.settings import TrainSettings


def lr_at(settings: TrainSettings, step: int) -> float:
    """The learning rate of the `step`-th applied optimizer step (0-based), as DeepSpeed sets it.

    Args:
        settings: resolved training settings (scheduler, lr, warmup_*, total_steps, min_lr_ratio).
        step: number of optimizer steps applied before this one (fp16-skipped steps do not count).

    Returns:
        The learning rate.
    """
    assert step >= 0, step
    if settings.scheduler == "constant":
        return settings.lr
    if settings.scheduler in HF_SCHEDULERS:
        return settings.lr * hf_lambda(settings, step)
    iteration = step - 1  # DeepSpeed's last_batch_iteration when this step runs
    if settings.scheduler == "warmup_cosine":
        return _cosine_lr(settings, iteration)
    if iteration < 0:
        return settings.warmup_min_lr
    gamma = _warmup_gamma(settings, iteration)
    if gamma is None:
        gamma = 1.0 if settings.scheduler == "warmup_constant" else _linear_decay_gamma(settings, iteration)
    return settings.warmup_min_lr + (settings.lr - settings.warmup_min_lr) * gamma


def _effective_warmup_steps(settings: TrainSettings) -> int:
    return max(2, settings.warmup_steps)  # DeepSpeed clamps warmup_num_steps to at least 2


def _warmup_gamma(settings: TrainSettings, iteration: int) -> float | None:
    """Warmup progress in [0, 1) during warmup (log or linear), None after it."""
    warmup_steps = _effective_warmup_steps(settings)
    if iteration >= warmup_steps:
        return None
    if settings.warmup_type == "log":
        return 1.0 / math.log(warmup_steps) * math.log(iteration + 1)
    return iteration / warmup_steps


def _linear_decay_gamma(settings: TrainSettings, iteration: int) -> float:
    total_steps = settings.total_steps
    assert total_steps is not None
    return max(
        0.0, float(total_steps - iteration) / float(max(1.0, total_steps - _effective_warmup_steps(settings)))
    )


def _cosine_lr(settings: TrainSettings, iteration: int) -> float:
    """WarmupCosineLR: lr times a ratio that warms up from warmup_min_ratio, then decays to min_lr_ratio."""
    if iteration < 0:
        return 0.0  # DeepSpeed sets 0 before its first step()
    warmup_gamma = _warmup_gamma(settings, iteration)
    if warmup_gamma is not None:
        ratio = settings.warmup_min_ratio + warmup_gamma * (1.0 - settings.warmup_min_ratio)
        return settings.lr * ratio
    total_steps = settings.total_steps
    assert total_steps is not None
    warmup_steps = _effective_warmup_steps(settings)
    real_last_step = iteration - warmup_steps + 1
    real_total_steps = max(1, total_steps - warmup_steps)
    cosine_progress = min(1.0, real_last_step / real_total_steps)
    ratio = (1 + math.cos(math.pi * cosine_progress)) / 2
    ratio = max(0.0, settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * ratio)
    return settings.lr * ratio


def hf_lambda(settings: TrainSettings, step: int) -> float:
    """The HF Trainer's multiplier of the peak lr for the `step`-th applied step (transformers' lr_lambda), or,
    past `settings.replan_from` (step, multiplier), the decay from that multiplier to 0 at the new horizon."""
    warmup, total = settings.warmup_steps, settings.total_steps
    if settings.replan_from is not None and step >= settings.replan_from[0]:
        start, reached = settings.replan_from
        if settings.scheduler == "constant_with_warmup":
            return 1.0
        progress = (step - start) / max(1, total - start)
        decay = (
            1.0 - progress if settings.scheduler == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        )
        return max(0.0, reached * decay)
    if step < warmup:
        return step / max(1, warmup)
    if settings.scheduler == "constant_with_warmup":
        return 1.0
    if settings.scheduler == "linear":
        return max(0.0, (total - step) / max(1, total - warmup))
    progress = (step - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))
