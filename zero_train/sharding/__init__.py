"""Our hand-written ZeRO-1, ZeRO-2 and ZeRO-3 in plain torch.distributed.

How to read it: docs/sharding.md (the files in reading order, a glossary); each stage: docs/zero1.md, zero2.md,
zero3.md.

step.py         PieceOptimizer, the step every stage shares: the inner optimizer over this rank's owned pieces,
                the agreement, global-norm clipping, skip on fp16 overflow
partition.py    which rank owns which elements of a flat buffer, pieces (pure arithmetic)
norms.py        the global gradient norm from pieces, the same bits however the tensors are cut
loss_scale.py   fp16 dynamic loss scaling (DeepSpeed's rules)
state_dict.py   the shard format every stage writes, consolidation, saved pieces cut for the pieces owned now
accounting.py   buffer bytes and bytes sent per step, per backend, from a partition (pure arithmetic)

zero12/         ZeRO-1 and ZeRO-2 (ShardedOptimizer, Zero1Optimizer, Zero2Optimizer): zero12/__init__.py
zero3/          ZeRO-3 (Zero3Model, Zero3Optimizer, MetaBuild): zero3/__init__.py
comm/           the collectives: gloo's rings beside NCCL's calls, the buckets and their order, the reduction
                queue, gather to one rank

Imports flow one way: zero12 | zero3 -> state_dict | accounting -> step -> norms | loss_scale -> comm -> partition
(pyproject's import contracts). A stage's class imports neither its checkpoints nor its byte accounting: those
are functions of the optimizer (zero12/state.py, zero12/report.py, zero3/state.py, zero3/report.py).
"""

from zero_train.sharding.loss_scale import DynamicLossScaler
from zero_train.sharding.state_dict import consolidate_shards
from zero_train.sharding.zero3.meta_build import MetaBuild
from zero_train.sharding.zero3.model import Zero3Model
from zero_train.sharding.zero3.optim import Zero3Optimizer
from zero_train.sharding.zero12.zero1 import Zero1Optimizer
from zero_train.sharding.zero12.zero2 import Zero2Optimizer

__all__ = [
    "DynamicLossScaler",
    "MetaBuild",
    "Zero1Optimizer",
    "Zero2Optimizer",
    "Zero3Model",
    "Zero3Optimizer",
    "consolidate_shards",
]
