"""Our hand-written ZeRO-1, ZeRO-2 and ZeRO-3 in plain torch.distributed (docs/zero1.md, zero2.md, zero3.md).

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

zero3.py        Zero3Model: each unit gathered around the forward and backward that use it, then freed
zero3_units.py  which parameters form a unit; a unit's slice, gathered buffer and gradient slice
zero3_hooks.py  how a module's backward is seen to begin (output hooks) and end (an identity function)
zero3_comm.py   ZeRO-3's two asynchronous collectives: gather the slices, reduce-scatter the gradients
zero3_grads.py  each unit's gradients reduce-scattered as soon as backward completes them, in one order
zero3_optim.py  Zero3Optimizer: an elementwise torch optimizer over this rank's pieces; clipping
zero3_state.py  its shards of optimizer state, re-cut at any world size; weights one tensor at a time
zero3_init.py   MetaBuild: a model built on the meta device, each parameter replayed with the same values
"""

from zero_train.sharding.loss_scale import DynamicLossScaler
from zero_train.sharding.state_dict import consolidate_shards
from zero_train.sharding.zero1 import Zero1Optimizer
from zero_train.sharding.zero2 import Zero2Optimizer
from zero_train.sharding.zero3 import Zero3Model
from zero_train.sharding.zero3_init import MetaBuild
from zero_train.sharding.zero3_optim import Zero3Optimizer

__all__ = [
    "DynamicLossScaler",
    "MetaBuild",
    "Zero1Optimizer",
    "Zero2Optimizer",
    "Zero3Model",
    "Zero3Optimizer",
    "consolidate_shards",
]
