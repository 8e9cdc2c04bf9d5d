"""What the engines of our own sharders (zero1, zero2, zero3) share: the step, the checkpoint, the memory account.

Their optimizer (sharding/step.PieceOptimizer) keeps the fp16 loss scaler, clips by the global norm in the same
all-reduce that agrees on the step, and writes its own shard of optimizer state; the engine only wires them to
the training loop.
"""

from __future__ import annotations

import math

import torch

from zero_train.checkpoint.writes import as_staged_writes
from zero_train.engines.base import tensor_bytes
from zero_train.engines.local import LocalEngine
from zero_train.engines.optim import set_lr
from zero_train.sharding.step import PieceOptimizer


class ShardedEngine(LocalEngine):
    """Base of Zero1Engine and Zero3Engine: a model and one of our sharded optimizers.

    A subclass builds `self.optimizer` with `self.loss_scaler` (engines/precision.make_loss_scaler: the
    optimizer scales and skips, LocalEngine's backward multiplies the loss by its scale), and writes
    `full_state_dict` and `load_checkpoint`.
    """

    optimizer: PieceOptimizer
    """Our sharded optimizer (Zero1Optimizer, Zero2Optimizer or Zero3Optimizer)."""

    def optimizer_shard(self) -> dict:
        """This rank's shard of optimizer state (the stage's sharding/*/state.py)."""
        raise NotImplementedError

    def sharder_bytes(self) -> dict[str, int]:
        """The bytes the optimizer holds by category (the stage's sharding/*/report.py)."""
        raise NotImplementedError

    def _apply_step(self, lr: float) -> tuple[torch.Tensor, bool]:
        """Clip by the global norm (one all-reduce; no clipping at grad_clip 0), step this rank's pieces at `lr`,
        zero the gradients. The gradients are reduced first where backward has not done it (ZeRO-1).

        Returns:
            (the norm, left on the device: the loop reads it when it logs; whether an fp16 overflow skipped
            the step).
        """
        grad_clip = self.settings.grad_clip
        grad_norm = self.optimizer.clip_grad_norm_(grad_clip if grad_clip > 0 else math.inf)
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        skipped = self.optimizer.last_step_skipped
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped

    def save_checkpoint(self, out, *, client_state: dict) -> None:
        """Rank 0: model/ (full fp32 weights); every rank: its optimizer shard, counters and client_state.

        `out` is a StagedWrites (zero_train.checkpoint.writes) or a folder to write into at once.
        """
        weights = self.full_state_dict()
        writes = as_staged_writes(out)
        self.write_checkpoint(writes, weights, client_state=client_state, optimizer=self.optimizer_shard())

    def memory_categories(self, device: torch.device | None = None) -> dict[str, int]:
        """The sharder's own account (params, grads, master_params, optimizer_states, comm_buffers).

        device: count only tensors on it. All the sharder's buffers live on the model's device; the inner
        optimizer's state may not (torch's Adam keeps "step" counters on the CPU when the model is on CUDA).
        """
        categories = dict(self.sharder_bytes())
        if device is None:
            return categories
        inner = self.optimizer.inner  # the inner torch optimizer over the owned masters (sharding/step.py)
        states = [v for state in inner.state.values() for v in state.values() if torch.is_tensor(v)]
        states_there = tensor_bytes(states, device=device)
        if torch.device(device).type != self.dist_info.device.type:  # none of the sharder's buffers are there
            return {name: (states_there if name == "optimizer_states" else 0) for name in categories}
        categories["optimizer_states"] -= tensor_bytes(states) - states_there
        return categories
