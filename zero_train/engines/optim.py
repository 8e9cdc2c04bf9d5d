"""The torch optimizer and learning-rate schedule that the DeepSpeed config describes.

The non-DeepSpeed engines (ddp, zero1, torch-zero) build their optimizer here and set the learning rate
by hand before every step from `zero_train.ds_config.lr_at`, the pure-function copy of DeepSpeed's
WarmupLR / WarmupDecayLR / WarmupCosineLR, so that every engine follows the same curve step for step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from zero_train.ds_config.schedule import lr_at
from zero_train.runtime.errors import UsageError

if TYPE_CHECKING:
    from zero_train.ds_config import TrainSettings


def optimizer_spec(settings: TrainSettings) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The torch optimizer class and constructor keywords for `settings.optimizer`.

    Adam/AdamW use the single-tensor implementation (foreach=False): it is what DeepSpeed's
    `torch_adam` path runs on flat partitions, and it is elementwise, so the update of a parameter
    does not depend on how the parameters are grouped or sharded (ddp and zero1 agree bit for bit).

    Args:
        settings: the resolved training settings.

    Returns:
        (optimizer class, keyword arguments without `params`).
    """
    lr = settings.lr
    if settings.optimizer in ("adamw", "adam"):
        kwargs = dict(
            lr=lr,
            betas=tuple(settings.betas),
            eps=settings.eps,
            weight_decay=settings.weight_decay,
            foreach=False,
        )
        cls = torch.optim.AdamW if settings.optimizer == "adamw" else torch.optim.Adam
        return cls, kwargs
    if settings.optimizer == "sgd":
        return torch.optim.SGD, dict(
            lr=lr, momentum=settings.momentum, weight_decay=settings.weight_decay, foreach=False
        )
    raise UsageError(f"optimizer {settings.optimizer!r} is not supported; use adamw, adam or sgd")


def build_optimizer(params, settings: TrainSettings) -> torch.optim.Optimizer:
    """A plain torch optimizer over `params` as `settings` describe it.

    Args:
        params: parameters (or param groups) to optimize.
        settings: the resolved training settings.

    Returns:
        The optimizer, with its lr set for step 0 of the schedule.
    """
    cls, kwargs = optimizer_spec(settings)
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
