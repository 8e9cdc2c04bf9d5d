"""The torch optimizer and learning-rate schedule that the DeepSpeed config describes.

The non-DeepSpeed engines (ddp, zero1, zero2, torch-zero, fsdp2) build their optimizer here and set the learning rate
by hand before every step from `zero_train.ds_config.lr_at`, the pure-function copy of DeepSpeed's
WarmupLR / WarmupDecayLR / WarmupCosineLR, so that every engine follows the same curve step for step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from zero_train.ds_config.keys import HF_SCHEDULERS
from zero_train.ds_config.schedule import hf_lambda, lr_at
from zero_train.runtime.errors import UsageError

if TYPE_CHECKING:
    from zero_train.ds_config import TrainSettings


def optimizer_spec(
    settings: TrainSettings, device: torch.device | None = None
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The torch optimizer class and constructor keywords for `settings.optimizer`.

    The implementation follows the device: fused kernels on CUDA (one launch for all tensors, no host
    synchronisation), the foreach (multi-tensor) one elsewhere; without a device, the single-tensor one
    (the DeepSpeed client optimizer keeps DeepSpeed's choice). All three are elementwise, so the update of a
    parameter does not depend on how the parameters are grouped or split between ranks: ddp and zero1 agree
    bit for bit with any of them (tests/sharding/test_partition.py checks foreach and single-tensor on split tensors).

    Args:
        settings: the resolved training settings.
        device: where the parameters live (the local engines pass their device).

    Returns:
        (optimizer class, keyword arguments without `params`).
    """
    implementation = _implementation(device)
    if settings.optimizer in ("adamw", "adam"):
        kwargs = dict(
            lr=settings.lr, betas=tuple(settings.betas), eps=settings.eps, weight_decay=settings.weight_decay
        )
        cls = torch.optim.AdamW if settings.optimizer == "adamw" else torch.optim.Adam
        return cls, {**kwargs, **implementation}
    if settings.optimizer == "sgd":
        kwargs = dict(lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)
        return torch.optim.SGD, {**kwargs, **implementation}
    raise UsageError(f"optimizer {settings.optimizer!r} is not supported; use adamw, adam or sgd")


def _implementation(device: torch.device | None) -> dict[str, bool]:
    """fused on CUDA, foreach on other devices, single-tensor without a device."""
    if device is None:
        return dict(foreach=False)
    if torch.device(device).type == "cuda":
        return dict(fused=True)
    return dict(foreach=True)


def build_optimizer(
    params, settings: TrainSettings, device: torch.device | None = None
) -> torch.optim.Optimizer:
    """A plain torch optimizer over `params` as `settings` describe it.

    Args:
        params: parameters (or param groups) to optimize.
        settings: the resolved training settings.
        device: where the parameters live (picks the implementation: optimizer_spec).

    Returns:
        The optimizer, with its lr set for step 0 of the schedule.
    """
    cls, kwargs = optimizer_spec(settings, device)
    optimizer = cls(params, **kwargs)
    set_lr(optimizer, scheduled_lr(settings, 0))
    return optimizer


def scheduled_lr(settings: TrainSettings, applied_steps: int) -> float:
    """The learning rate of the optimizer step that follows `applied_steps` applied steps.

    Args:
        settings: the resolved training settings.
        applied_steps: optimizer steps applied so far (fp16-skipped steps do not count, as in DeepSpeed).

    Returns:
        The learning rate, exactly as DeepSpeed's scheduler would set it.
    """
    return float(lr_at(settings, applied_steps))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set `lr` on every param group (DeepSpeed's schedulers use one lr for all groups)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def client_lr_scheduler(settings: TrainSettings):
    """For DeepSpeed's engine under an HF Trainer schedule (no scheduler block): the `lr_scheduler` callable
    deepspeed.initialize calls with its optimizer, a LambdaLR on lr_at's curve (None for DeepSpeed's own)."""
    if settings.scheduler not in HF_SCHEDULERS:
        return None

    def build(optimizer):
        for group in optimizer.param_groups:  # the peak, whatever lr the optimizer was built with
            group["initial_lr"] = settings.lr
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: hf_lambda(settings, step))

    return build
