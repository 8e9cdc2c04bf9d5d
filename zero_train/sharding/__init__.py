"""Our hand-written ZeRO-1 and ZeRO-2 in plain torch.distributed (docs/zero1.md, docs/zero2.md).

partition.py    which rank owns which elements of a flat buffer, pieces, buckets (pure arithmetic)
accounting.py   buffer bytes and bytes sent per step, per backend, from a partition (pure arithmetic)
norms.py        the global gradient norm from pieces, the same bits however the tensors are cut
collectives.py  the few collectives the sharders use (gloo: our point-to-point rings)
overlap.py      bucket reductions launched during backward, waited for once at its end
hooks.py        the post-accumulate-grad hooks and the end-of-backward callback
segments.py     a flat parameter buffer, this rank's slice and its fp32 masters
sharded.py      ShardedOptimizer: segments, the inner optimizer, clipping, the step, param_groups
report.py       what a sharder reports: bytes by category, bytes sent, balance
zero1.py        Zero1Optimizer: every gradient in one flat buffer, reduced to the owners at the boundary
flat_grads.py   ZeRO-1's flat gradient buffer, filled by the hooks, reduced bucket by bucket
zero2.py        Zero2Optimizer: gradients reduced to their owners bucket by bucket during backward
grad_buckets.py ZeRO-2's buckets, bucket buffers and accumulator of the owned gradients
state_dict.py   per-rank shards of pieces, consolidation, re-sharding
gather.py       one tensor at a time onto the rank that writes a checkpoint or an export
loss_scale.py   fp16 dynamic loss scaling (DeepSpeed's rules)
"""

from zero_train.sharding.loss_scale import DynamicLossScaler
from zero_train.sharding.state_dict import consolidate_shards
from zero_train.sharding.zero1 import Zero1Optimizer
from zero_train.sharding.zero2 import Zero2Optimizer

__all__ = ["DynamicLossScaler", "Zero1Optimizer", "Zero2Optimizer", "consolidate_shards"]
