"""What our ZeRO sharders hold in buffers and send per step, from the partition alone (pure arithmetic).

One computation for every reader: zero12/report.py's memory_bytes() / comm_bytes_per_step() call these
functions on their own partitions, and the memory model (memory/model/peak_terms.py) and the report
(report/buffers.py, report/explain_runtime.py) call them on the partition of a run they did not see.

The answer depends on the backend (comm/groups.uses_p2p_rings):
    gloo   our isend/irecv rings: only data travels (never the padding at the end of the buffer), through
           a receive buffer of at most comm/gloo.RECV_BUFFER_ELEMENTS elements (in chunks)
    nccl   torch's reduce / all_gather_into_tensor: the all-gather moves whole slices (padding included),
           and torch keeps no receive buffer of ours

Bytes per parameter for Adam (8 bytes of state per parameter, N ranks; the padding, fewer than N
elements, and one 4-byte step counter per piece aside):
    ZeRO-1 fp32 model:       4 (params) + 4 (grads) + 8/N (exp_avg, exp_avg_sq)            = 8 + 8/N
    ZeRO-1 bf16/fp16 model:  2 (params) + 2 (grads) + (4 master + 8 state)/N               = 4 + 12/N
    ZeRO-2 fp32 model:       4 (params) + (4 grads + 8 state)/N                            = 4 + 12/N
    ZeRO-2 bf16/fp16 model:  2 (params) + (2 grads + 4 master + 8 state)/N                 = 2 + 14/N
the ZeRO paper's P_os and P_os+g rows (K = 12 in mixed precision).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zero_train.sharding.comm import gloo
from zero_train.sharding.comm.buckets import bucket_groups, gradient_buckets
from zero_train.sharding.partition import FlatPartition, flat_partition

ENTRY_BYTES = 8
"""One float64 entry of the all-reduce that agrees on the step: a has-gradient flag per tensor, the sum
of squares, the fp16 overflow count."""


def uses_p2p_backend(backend: str, world_size: int) -> bool:
    """True when our point-to-point rings carry the traffic: gloo with more than one rank."""
    return backend == "gloo" and world_size > 1


def partition_of(numels: Sequence[int], world_size: int) -> FlatPartition:
    """The partition our sharders build for a model whose tensors have these sizes (one segment)."""
    return flat_partition(numels, world_size)


def padding(partition: FlatPartition) -> int:
    """Padding elements at the end of the flat buffer (fewer than N when there is any data)."""
    return partition.total_size - partition.num_elements


def even_partition(num_params: int, world_size: int) -> FlatPartition:
    """The partition of `num_params` elements without tensor sizes (one tensor): for estimates."""
    return flat_partition([num_params], world_size)


@dataclass(frozen=True, slots=True)
class BufferBytes:
    """The buffers a sharder keeps besides parameters, gradients and optimizer state."""

    padding: int
    """Bytes of padding in ONE flat buffer (fewer than N elements, at its end)."""
    receive_elements: int
    """Elements of the gloo ring's receive buffer (0 on NCCL or with one rank)."""
    receive: int
    """Its bytes."""
    partition_elements: int
    """Elements of one rank's slice of the flat buffers."""
    flat_buffers: int
    """How many flat buffers carry the padding (ZeRO-1: parameters and gradients; ZeRO-2: parameters only)."""
    bucket: int = 0
    """Bytes of ZeRO-2's two bucket buffers (the largest bucket that is copied, twice; 0 for ZeRO-1)."""

    @property
    def comm_buffers(self) -> int:
        """Padding of every flat buffer, the buckets and the receive buffer: the probe's comm_buffers."""
        return self.flat_buffers * self.padding + self.bucket + self.receive


def _receive_elements(partition: FlatPartition, backend: str, bucket_elements: int) -> int:
    if not uses_p2p_backend(backend, partition.world_size):
        return 0
    buckets = gradient_buckets(partition, bucket_elements)
    return max((gloo.ring_receive_elements(list(b.lengths)) for b in buckets), default=0)


def zero1_buffers(
    partition: FlatPartition, element_size: int, backend: str, bucket_elements: int
) -> BufferBytes:
    """Our ZeRO-1's buffers: two flat buffers (parameters, gradients) and, on gloo, the receive buffer.

    Args:
        partition: the partition (`partition_of` or the optimizer's own).
        element_size: bytes per element of the model dtype.
        backend: "gloo" or "nccl" (any non-gloo backend runs torch's collectives).
        bucket_elements: zero_optimization.reduce_bucket_size (the receive buffer fits the largest bucket).
    """
    return _buffers(partition, element_size, backend, bucket_elements, flat_buffers=2)


def zero2_buffers(
    partition: FlatPartition, element_size: int, backend: str, bucket_elements: int
) -> BufferBytes:
    """Our ZeRO-2's buffers: the flat parameter buffer's padding, two bucket buffers, on gloo the receive buffer.

    The bucket buffers hold the largest bucket that is copied (a tensor of bucket_elements or more is
    reduced in its own gradient); two, so that a bucket can fill while the previous one travels. Arguments
    as zero1_buffers.
    """
    buckets = gradient_buckets(partition, bucket_elements)
    copied = max((b.size for b in buckets if not b.direct), default=0)
    bucket = 2 * copied * element_size
    return _buffers(partition, element_size, backend, bucket_elements, flat_buffers=1, bucket=bucket)


def _buffers(
    partition: FlatPartition, element_size: int, backend: str, bucket_elements: int, **stage
) -> BufferBytes:
    receive = _receive_elements(partition, backend, bucket_elements)
    return BufferBytes(
        padding=padding(partition) * element_size,
        receive_elements=receive,
        receive=receive * element_size,
        partition_elements=partition.partition_size,
        **stage,
    )


def agreement_bytes(num_tensors: int, world_size: int) -> int:
    """Bytes a rank sends in the ring all-reduce (2 (N-1)/N of the vector) that agrees on the step:
    a has-gradient count per tensor and the sum of |g|^p of the gradients (not finite on an fp16 overflow)."""
    return (2 * (world_size - 1) * ENTRY_BYTES * (num_tensors + 1)) // world_size


def comm_bytes_per_step(
    partition: FlatPartition,
    rank: int,
    element_size: int,
    backend: str,
    *,
    active: Sequence[bool] | None = None,
    micro_steps: int = 1,
    reduce_element_size: int | None = None,
) -> dict[str, int]:
    """Bytes `rank` sends per optimizer step (one accumulation boundary), by collective.

    The reduction of the gradients (buckets of trainable tensors) sends every rank part but this rank's
    own, once per reduction (ZeRO-1: once per step; ZeRO-2: once per micro-step); the all-gather of the
    parameters sends every slice but the right neighbour's (gloo: data only; NCCL: whole slices).

    Args:
        partition: the partition.
        rank: the sending rank.
        element_size: bytes per element of the model dtype.
        backend: "gloo" (our rings) or "nccl" (torch's collectives).
        active: whether each tensor is trainable now (frozen ones are not reduced; default all).
        micro_steps: reductions per step (ZeRO-2: the gradient accumulation steps).
        reduce_element_size: bytes per gradient element on the wire (default: `element_size`).

    Returns:
        {"reduce", "all_gather", "all_reduce" (flags and norm), "broadcast", "total"}.
    """
    world_size = partition.world_size
    if world_size == 1:
        return dict(reduce=0, all_gather=0, all_reduce=0, broadcast=0, total=0)
    buckets = gradient_buckets(partition, None, active)
    reduce = (
        sum(b.size - b.lengths[rank] for b in buckets) * (reduce_element_size or element_size) * micro_steps
    )
    if uses_p2p_backend(backend, world_size):
        gather = (partition.num_elements - partition.loads()[(rank + 1) % world_size]) * element_size
    else:
        gather = (world_size - 1) * partition.partition_size * element_size
    counts = dict(
        reduce=reduce,
        all_gather=gather,
        all_reduce=agreement_bytes(len(partition.numels), world_size),
        broadcast=0,
    )
    counts["total"] = sum(counts.values())
    return counts


def balance_report(partitions: FlatPartition | Sequence[FlatPartition], element_size: int) -> dict:
    """How evenly the parameters are spread (bytes each rank owns, and the padding).

    Args:
        partitions: one flat partition, or several over the same ranks (a sharder's segments: their sums).
        element_size: bytes per element (4 for fp32, 2 for bf16/fp16).

    Returns:
        {"bytes_per_rank": [...], "max_bytes", "min_bytes", "max_over_mean", "padding_bytes",
        "pieces_per_rank": [...]} ; max_over_mean is 1.0 for a perfect balance.
    """
    partitions = [partitions] if isinstance(partitions, FlatPartition) else list(partitions)
    ranks = range(partitions[0].world_size)
    loads = [sum(loads) for loads in zip(*(p.loads() for p in partitions), strict=True)]
    mean = sum(loads) / len(ranks)
    return dict(
        bytes_per_rank=[load * element_size for load in loads],
        max_bytes=max(loads) * element_size,
        min_bytes=min(loads) * element_size,
        max_over_mean=(max(loads) / mean) if mean else 1.0,
        padding_bytes=sum(padding(p) for p in partitions) * element_size,
        pieces_per_rank=[sum(len(p.pieces(rank)) for p in partitions) for rank in ranks],
    )


MIN_BUCKETS = 4
"""Buckets a model is cut into at least when the config sets no reduce_bucket_size: the last bucket (the first
layers) is reduced after backward ends, so one bucket overlaps nothing; with four, three of them travel while
backward computes (docs/zero1.md#buckets)."""


def default_bucket_elements(numels: Sequence[int], cap: int) -> int:
    """The bucket size when the config sets none: a MIN_BUCKETS-th of the elements (at most `cap`, DeepSpeed's
    5e8), halved until `bucket_groups` cuts the tensors into at least MIN_BUCKETS buckets. Buckets hold whole
    tensors, so a model whose embedding dominates needs smaller ones for the rest (any model of at least
    MIN_BUCKETS tensors gets there: at 1 element every tensor is its own bucket)."""
    size = max(1, min(int(cap), -(-sum(numels) // MIN_BUCKETS)))
    while size > 1 and len(bucket_groups(numels, size)) < MIN_BUCKETS:
        size //= 2
    return size
