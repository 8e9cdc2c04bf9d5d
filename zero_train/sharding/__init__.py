"""Our hand-written ZeRO-1: optimizer-state sharding in plain torch.distributed (see docs/zero1.md)."""

from zero_train.sharding.loss_scale import DynamicLossScaler
from zero_train.sharding.state_dict import consolidate_shards
from zero_train.sharding.zero1 import Zero1Optimizer

__all__ = ["DynamicLossScaler", "Zero1Optimizer", "consolidate_shards"]
