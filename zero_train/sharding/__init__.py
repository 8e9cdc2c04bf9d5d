"""Our hand-written ZeRO-1 and ZeRO-2 in plain torch.distributed (docs/zero1.md, docs/zero2.md).

partition.py    who owns which tensor and where it sits in the flat buffers (pure arithmetic)
accounting.py   buffer bytes and bytes sent per step, per backend, from a layout (pure arithmetic)
collectives.py  the few collectives the sharders use (gloo: our point-to-point rings)
sharded.py      ShardedOptimizer: owners, flat parameter buffer, clipping, the step, param_groups
zero1.py        Zero1Optimizer: every gradient in one flat buffer, reduce-scattered at the boundary
flat_grads.py   ZeRO-1's flat gradient buffer and the hooks that fill it
zero2.py        Zero2Optimizer: gradients reduced to their owners bucket by bucket during backward
grad_buckets.py ZeRO-2's buckets, hooks and accumulator of the owned gradients
state_dict.py   per-rank shards, consolidation, re-sharding
gather.py       one tensor at a time onto the rank that writes a checkpoint or an export
loss_scale.py   fp16 dynamic loss scaling (DeepSpeed's rules)
"""

from zero_train.sharding.loss_scale import DynamicLossScaler
from zero_train.sharding.state_dict import consolidate_shards
from zero_train.sharding.zero1 import Zero1Optimizer
from zero_train.sharding.zero2 import Zero2Optimizer

__all__ = ["DynamicLossScaler", "Zero1Optimizer", "Zero2Optimizer", "consolidate_shards"]
