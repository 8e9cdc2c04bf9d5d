"""What the engines that drive a torch optimizer themselves (ddp, zero1, zero2, torch-zero) share.

The accumulation bookkeeping follows DeepSpeed's engine: micro-batch losses are divided by grad_accum
before backward, `step()` must come exactly after grad_accum micro-batches, and the schedule advances
only on applied steps.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Any

import torch

from zero_train.checkpoint.files import load_rank_file, rank_file, save_rank_file, write_model
from zero_train.engines.base import StepResult
from zero_train.engines.optim import scheduled_lr, set_lr
from zero_train.engines.precision import PRECISION_DTYPES, DynamicLossScaler
from zero_train.registry import ENGINES, find_engine

if TYPE_CHECKING:
    from zero_train.ds_config import TrainSettings
    from zero_train.runtime.dist import DistInfo


class LocalEngine:
    """Base class: builds the model in the settings' dtype and counts micro-steps and steps.

    Subclasses implement `_forward_module`, `_no_sync`, `_apply_step`; the fp16 loss scaler is
    `self.loss_scaler` (our sharders' engines hand the same one to their optimizer: engines/sharded.py).
    """

    name = "local"

    def __init__(self, *, model_fn, settings: TrainSettings, ds_config: dict, dist_info: DistInfo):
        self._start(settings, dist_info)
        self.model = model_fn().to(device=dist_info.device, dtype=PRECISION_DTYPES[settings.precision])

    def _start(self, settings: TrainSettings, dist_info: DistInfo) -> None:
        """What every engine on this base sets first (zero3 and fsdp2 build their model otherwise)."""
        self.settings = settings
        self.dist_info = dist_info
        self.process_group = None  # the default (world) group; engines take it explicitly
        self.loss_scaler: DynamicLossScaler | None = None  # fp16 only
        warn_unsupported(settings, engine=self.name)
        self.micro_steps = self.global_steps = self.applied_steps = 0

    def forward_backward(
        self, batch: torch.LongTensor, labels: torch.LongTensor | None = None
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch (labels shifted inside the HF model).

        Args:
            batch: token ids, shape (micro_batch_size, block_size).
            labels: the same shape, -100 where no loss is taken (None: the ids themselves).

        Returns:
            The micro-batch's mean token loss (detached, unscaled, fp32).
        """
        boundary = (self.micro_steps + 1) % self.settings.grad_accum == 0
        batch = batch.to(self.dist_info.device, non_blocking=True)  # from pinned memory on CUDA: no wait
        labels = batch if labels is None else labels.to(self.dist_info.device, non_blocking=True)
        with self._no_sync(boundary):
            loss = self._forward_module()(input_ids=batch, labels=labels).loss
            self._backward(loss / self.settings.grad_accum)
        self.micro_steps += 1
        return loss.detach().float()

    def step(self) -> StepResult:
        """Reduce, clip, update, advance the schedule and zero the gradients (at the boundary only)."""
        expected = (self.global_steps + 1) * self.settings.grad_accum
        if self.micro_steps != expected:
            raise RuntimeError(
                f"step() after {self.micro_steps} micro-batches; expected {expected} "
                f"(grad_accum={self.settings.grad_accum} per step)"
            )
        lr = self.lr()
        grad_norm, skipped = self._apply_step(lr)
        self.global_steps += 1
        self.applied_steps += 0 if skipped else 1
        return StepResult(grad_norm=grad_norm, skipped=skipped, lr=lr, loss_scale=self.loss_scale())

    def lr(self) -> float:
        """The learning rate the next optimizer step will use."""
        return scheduled_lr(self.settings, self.applied_steps)

    def counters(self) -> dict[str, int]:
        """Step counters saved with a checkpoint."""
        return dict(
            micro_steps=self.micro_steps, global_steps=self.global_steps, applied_steps=self.applied_steps
        )

    def write_checkpoint(self, writes, weights: dict | None, *, client_state: dict, **extra) -> None:
        """Rank 0: model/ from `weights` (the full fp32 state dict, None elsewhere); every rank: its rank file
        of client_state, counters, world size and `extra` (its optimizer shard, loss scaler)."""
        if self.dist_info.is_main:
            write_model(writes, self.model, weights)
        payload = dict(
            client_state=client_state, counters=self.counters(), world_size=self.dist_info.world_size, **extra
        )
        save_rank_file(writes, self.dist_info.rank, payload)

    def restore_counters(self, saved: dict[str, Any]) -> None:
        """Restore counters written by `counters()`."""
        self.micro_steps = int(saved["micro_steps"])
        self.global_steps = int(saved["global_steps"])
        self.applied_steps = int(saved["applied_steps"])

    def restore_unsharded_state(self, path, main: dict | None = None) -> dict:
        """Counters and the loss scale from rank 0's file `main` (read from `path` if not given: they are
        not sharded); returns this rank's client_state, rank 0's for a rank that did not exist at the save."""
        main = load_rank_file(path, 0) if main is None else main
        self.restore_counters(main["counters"])
        scaler = getattr(self, "loss_scaler", None)
        if scaler is not None and main.get("loss_scaler"):
            scaler.load_state_dict(main["loss_scaler"])
        own = (
            load_rank_file(path, self.dist_info.rank)
            if rank_file(path, self.dist_info.rank).is_file()
            else main
        )
        return own["client_state"]

    def loss_scale(self) -> float | None:
        """The current fp16 loss scale, None without loss scaling."""
        return None if self.loss_scaler is None else float(self.loss_scaler.loss_scale)

    def _forward_module(self) -> torch.nn.Module:
        return self.model

    def _no_sync(self, boundary: bool):
        return contextlib.nullcontext()

    def _backward(self, loss: torch.Tensor) -> None:
        if self.loss_scaler is not None:
            loss = loss * self.loss_scaler.loss_scale
        loss.backward()

    def _apply_step(self, lr: float) -> tuple[torch.Tensor | float | None, bool]:
        raise NotImplementedError

    def _step_unless_overflow(self, grad_norm: torch.Tensor, params: list[torch.Tensor], lr: float) -> bool:
        """ddp's and fsdp2's step once the gradients are averaged and unscaled: with fp16 loss scaling, the
        overflow is read back (it decides the step) and the scale updated; then clip `params` by `grad_norm`
        (grad_clip > 0) and step `self.optimizer` at `lr`. Returns whether an overflow skipped the step."""
        if self.loss_scaler is not None:
            overflow = not bool(torch.isfinite(grad_norm))
            self.loss_scaler.update_scale(overflow)
            if overflow:
                return True
        if self.settings.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.settings.grad_clip, grad_norm)
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        return False


def warn_unsupported(settings: TrainSettings, *, engine: str) -> None:
    """Warn about settings this engine does not implement (never ignore a setting silently).

    Only DeepSpeed offloads. A local engine (ddp, zero1, zero2, torch-zero) reads any config of its stage or
    below (stage 1 too for DDP: the JSON of a ZeRO-1 run trains DDP with the same batch and optimizer).
    """
    for field in ("offload_optimizer", "offload_param"):
        value = getattr(settings, field)
        if value != "none":
            warnings.warn(
                f"engine {engine!r} ignores {field}={value!r} (only the deepspeed engines offload); "
                "use --engine deepspeed to offload",
                stacklevel=3,
            )
    spec = find_engine(engine)
    if spec is not None and spec.family is None and settings.zero_stage > max(spec.stage, 1):
        others = [other.name for other in ENGINES if other.stage == settings.zero_stage]
        warnings.warn(
            f"engine {engine!r} ignores zero_stage={settings.zero_stage} from the config; "
            f"use an engine of that stage: --engine {' | '.join(others)}",
            stacklevel=3,
        )
