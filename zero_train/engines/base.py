"""The one interface the train loop sees: an Engine, whatever shards what underneath.

    engine = build_engine("zero1", model_fn=lambda: load_model("tiny"), settings=settings,
                          ds_config=resolved_config, dist_info=dist_info)
    for step in range(max_steps):
        for batch in micro_batches:                  # settings.grad_accum of them
            loss = engine.forward_backward(batch)
        result = engine.step()                       # reduce, clip, optimizer step, schedule, zero grads

Every engine follows DeepSpeed's semantics, so that comparisons are like for like: the loss of a
micro-batch is divided by grad_accum before backward, gradients are averaged over ranks, the global
gradient norm (before clipping) is reported, the learning rate follows DeepSpeed's scheduler
(`zero_train.ds_config.lr_at`) and only advances on steps that were applied (an fp16 overflow skips
both the update and the schedule, as DeepSpeed does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from zero_train.ds_config import TrainSettings

MEMORY_CATEGORIES = ("params", "grads", "master_params", "optimizer_states", "comm_buffers")


@dataclass(kw_only=True, slots=True, frozen=True)
class StepResult:
    """What one optimizer step (an accumulation boundary) reports."""

    grad_norm: float | torch.Tensor | None
    """Global L2 norm of the averaged, unscaled gradients before clipping (None if not computed): a float, or
    a 0-dim tensor on the device that the caller reads when it logs (train/loop.py reads it with the loss,
    once per step), so that the step itself does not wait for the device."""
    skipped: bool
    """True when the update was not applied (fp16 overflow: the loss scale was lowered instead)."""
    lr: float
    """Learning rate this step used (or would have used, if skipped)."""
    loss_scale: float | None = None
    """The fp16 dynamic loss scale after this step; None without loss scaling."""


class Engine(Protocol):
    """A model plus its optimizer, gradient reduction, precision and checkpoint format."""

    name: str
    """The engine's name in zero_train.registry (build_engine sets it: "ds2", "fsdp2-z3", "zero1", ...)."""
    model: torch.nn.Module
    """The unwrapped Hugging Face model (for ZeRO-3: with partitioned parameters)."""
    settings: TrainSettings
    """Batch sizes, precision, optimizer, schedule and clipping, from the DeepSpeed config."""

    def forward_backward(
        self, batch: torch.LongTensor, labels: torch.LongTensor | None = None
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch (labels: the ids, or -100 where no loss is taken; None: the
        ids themselves); returns its loss (detached, unscaled, fp32)."""
        ...

    def step(self) -> StepResult:
        """At the accumulation boundary: reduce, clip, optimizer step, schedule, zero grads."""
        ...

    def lr(self) -> float:
        """The learning rate the next optimizer step will use."""
        ...

    def save_checkpoint(self, path, *, client_state: dict) -> None:
        """Write this engine's files inside the staging dir `path` (collective: every rank calls it)."""
        ...

    def load_checkpoint(self, path) -> dict:
        """Restore model, optimizer and schedule from checkpoint dir `path`; returns the client_state."""
        ...

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Consolidated fp32 (or model-dtype) weights on rank 0, None elsewhere (collective)."""
        ...

    def memory_categories(self, device: torch.device | None = None) -> dict[str, int]:
        """Bytes this rank holds per category (keys: MEMORY_CATEGORIES), from the engine's own tensors.

        device: count only tensors stored on this device (None: wherever they are). The memory probe
        compares the measured device's level with the bytes on that device only; the rest (DeepSpeed's
        offloaded states in pinned host memory, CPU step counters) is reported beside it.
        """
        ...


def tensor_bytes(tensors, seen: set | None = None, *, device: torch.device | str | None = None) -> int:
    """Total bytes of the storages behind `tensors`, each storage counted once.

    A view (a parameter inside a flat buffer, a partition) counts its whole storage, once; None and
    empty tensors count nothing.

    Args:
        tensors: an iterable of tensors (or None).
        seen: storages already counted elsewhere (updated), to avoid double counting across categories.
        device: count only storages on this device (None: all). A storage elsewhere is still marked
            seen, so a later category does not count it either (as without the filter).

    Returns:
        The bytes.
    """
    seen = set() if seen is None else seen
    wanted = None if device is None else torch.device(device)
    total = 0
    for tensor in tensors:
        if tensor is None or tensor.numel() == 0:
            continue
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()  # addresses are per device; meta storages all have 0: key them by object
        key = (storage.device, pointer or storage._cdata)
        if key in seen:
            continue
        seen.add(key)
        if wanted is None or _same_device(storage.device, wanted):
            total += storage.nbytes()
    return total


def _same_device(stored: torch.device, wanted: torch.device) -> bool:
    """cuda:0 matches "cuda" only if it is the current device; types and indices must agree otherwise."""
    if stored.type != wanted.type:
        return False
    if stored.type != "cuda" or wanted.index is None:
        return True
    return (stored.index if stored.index is not None else 0) == wanted.index
