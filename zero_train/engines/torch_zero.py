"""PyTorch's own ZeRO-1: torch.distributed.optim.ZeroRedundancyOptimizer under DDP.

DDP averages the gradients exactly as in the ddp engine; ZeroRedundancyOptimizer then lets each rank
update only the parameters it owns (sorted-greedy partition by size) with its share of the optimizer
state, and broadcasts the updated parameters from their owners. Unlike our zero1 engine and
DeepSpeed, the fp32 master copies (mixed precision) and all gradients stay whole on every rank.
"""

from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from zero_train.engines.ddp import DDPEngine, _optimizer_state_bytes
from zero_train.engines.optim import optimizer_spec, scheduled_lr


class TorchZeroEngine(DDPEngine):
    """DDP + ZeroRedundancyOptimizer (optimizer state sharded, everything else replicated)."""

    name = "torch-zero"

    def _build_optimizer(self, params) -> torch.optim.Optimizer:
        optimizer_class, kwargs = optimizer_spec(self.settings, self.dist_info.device)
        kwargs["lr"] = scheduled_lr(self.settings, 0)
        return ZeroRedundancyOptimizer(
            params, optimizer_class=optimizer_class, process_group=self.process_group, **kwargs
        )

    def _optimizer_state(self) -> dict | None:
        """Collective: gather every rank's shard of the optimizer state onto rank 0."""
        self.optimizer.consolidate_state_dict(to=0)
        return self.optimizer.state_dict() if self.dist_info.is_main else None

    def memory_categories(self, device: torch.device | None = None) -> dict[str, int]:
        """As DDP, but optimizer_states counts only this rank's shard (the local optimizer's state)."""
        categories = super().memory_categories(device)
        categories["optimizer_states"] = _optimizer_state_bytes(self.optimizer.optim, device)
        return categories
