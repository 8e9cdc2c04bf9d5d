"""The sharders' communication: gloo's point-to-point rings beside NCCL's torch collectives.

groups.py       rank, world size and backend of a process group (no communication)
collectives.py  the sharders' collectives, each choosing gloo.py or nccl.py in one line
gloo.py         our rings of isend/irecv (ZeRO-1/2) and direct exchanges (ZeRO-3), their pure schedules
nccl.py         torch's collectives on NCCL (any backend but gloo): one call each, async handles
buckets.py      which gradients travel together (buckets of whole tensors) and the one order all ranks launch them in
overlap.py      ReductionQueue: bucket reductions launched during backward, waited for once at its end
gather.py       one tensor at a time onto the rank that writes a checkpoint or an export
"""
