"""Our ZeRO-1 and ZeRO-2: every rank keeps the whole model; optimizer state (ZeRO-2: gradients too) sharded.

sharded.py      ShardedOptimizer: segments, their gradient stores, the hooks (the step: ../step.py)
segments.py     a flat parameter buffer, this rank's slice and its fp32 masters
backward.py     the stores' one interface, the backward hooks (buckets and their order: ../comm/buckets.py)
report.py       functions of a ZeRO-1/2 optimizer: bytes by category, bytes sent, balance, pieces
state.py        functions of a ZeRO-1/2 optimizer: its shards (with the fp32 masters), loading, full masters
zero1.py        Zero1Optimizer: every gradient in one flat buffer, reduced to the owners at the boundary
flat_grads.py   ZeRO-1's flat gradient buffer, filled by the hooks, reduced bucket by bucket
zero2.py        Zero2Optimizer: gradients reduced to their owners bucket by bucket during backward
grad_buckets.py ZeRO-2's buckets, bucket buffers and accumulator of the owned gradients
"""
