"""What our ZeRO sharders hold in buffers and send per step, from the layout alone (pure arithmetic).

One computation for every reader: Zero1Optimizer.memory_bytes() / comm_bytes_per_step() call these
functions on their own layout, and the memory model (memory/model/peak_terms.py) and the report
(report/buffers.py, report/explain_runtime.py) call them on the layout of a run they did not see.

The answer depends on the backend (collectives.uses_p2p_rings):
    gloo   our isend/irecv rings: only each region's data travels (never its padding), through a
           receive buffer of at most collectives.RECV_BUFFER_ELEMENTS elements (in pieces)
    nccl   torch's reduce_scatter_tensor / all_gather_into_tensor: whole regions (padding included)
           travel, and torch keeps no receive buffer of ours

Bytes per parameter for Adam (K = 8 bytes of state per parameter, N ranks, no padding):
    fp32 model:       4 (params) + 4 (grads) + 8/N (exp_avg, exp_avg_sq)          = 8 + 8/N
    bf16/fp16 model:  2 (params) + 2 (grads) + (4 master + 8 state)/N             = 4 + 12/N
the ZeRO paper's P_os row (2 + 2 + K/N with K = 12 in mixed precision).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zero_train.sharding import collectives
from zero_train.sharding.partition import FlatLayout, flat_layout, gradient_buckets, greedy_owners

ENTRY_BYTES = 4
"""One fp32 entry of the all-reduce that agrees on the step: a norm or a has-gradient flag per tensor."""


def uses_p2p_backend(backend: str, world_size: int) -> bool:
    """True when our point-to-point rings carry the traffic: gloo with more than one rank."""
    return backend == "gloo" and world_size > 1


def owner_layout(numels: Sequence[int], world_size: int) -> FlatLayout:
    """The layout our sharders build for tensors of these sizes (sorted-greedy owners, regions by owner)."""
    return flat_layout(numels, greedy_owners(numels, world_size), world_size)


def even_layout(num_params: int, world_size: int) -> FlatLayout:
    """An even split of `num_params` over the ranks (one tensor each): for estimates without tensor sizes."""
    even = -(-num_params // world_size)
    return flat_layout([even] * world_size, list(range(world_size)), world_size)


@dataclass(frozen=True, slots=True)
class BufferBytes:
    """The buffers a sharder keeps besides parameters, gradients and optimizer state."""

    padding: int
    """Bytes of padding in ONE owner-ordered flat buffer (every region padded to the largest)."""
    receive_elements: int
    """Elements of the gloo ring's receive buffer (0 on NCCL or with one rank)."""
    receive: int
    """Its bytes."""
    region_elements: int
    """Elements of one region of the flat buffers."""
    flat_buffers: int
    """How many owner-ordered flat buffers carry the padding (ZeRO-1: parameters and gradients; ZeRO-2:
    parameters only)."""
    bucket: int = 0
    """Bytes of ZeRO-2's bucket buffer (the largest bucket that is copied; 0 for ZeRO-1)."""

    @property
    def comm_buffers(self) -> int:
        """Padding of every flat buffer, the bucket and the receive buffer: the probe's comm_buffers."""
        return self.flat_buffers * self.padding + self.bucket + self.receive


def zero1_buffers(layout: FlatLayout, element_size: int, backend: str) -> BufferBytes:
    """Our ZeRO-1's buffers: two flat buffers (parameters, gradients) and, on gloo, the receive buffer.

    Args:
        layout: the owner-ordered layout (`owner_layout` or the optimizer's own).
        element_size: bytes per element of the model dtype.
        backend: "gloo" or "nccl" (any non-gloo backend runs torch's collectives).
    """
    p2p = uses_p2p_backend(backend, layout.world_size)
    receive = min(layout.region_size, collectives.RECV_BUFFER_ELEMENTS) if p2p else 0
    return BufferBytes(
        padding=layout.padding() * element_size,
        receive_elements=receive,
        receive=receive * element_size,
        region_elements=layout.region_size,
        flat_buffers=2,
    )


def zero2_buffers(layout: FlatLayout, element_size: int, backend: str, bucket_elements: int) -> BufferBytes:
    """Our ZeRO-2's buffers: the padded flat parameter buffer, one bucket buffer, on gloo the receive buffer.

    The bucket buffer holds the largest bucket that is copied (a tensor of bucket_elements or more is
    reduced in its own gradient); the receive buffer the largest region of any bucket, at most
    collectives.RECV_BUFFER_ELEMENTS.

    Args:
        layout: the owner-ordered layout.
        element_size: bytes per element of the model dtype.
        backend: "gloo" or "nccl".
        bucket_elements: zero_optimization.reduce_bucket_size.
    """
    buckets = gradient_buckets(layout, bucket_elements)
    copied = max((b.size for b in buckets if not b.direct), default=0)
    largest_region = max((max(b.lengths) for b in buckets), default=0)
    p2p = uses_p2p_backend(backend, layout.world_size)
    receive = min(largest_region, collectives.RECV_BUFFER_ELEMENTS) if p2p else 0
    return BufferBytes(
        padding=layout.padding() * element_size,
        receive_elements=receive,
        receive=receive * element_size,
        region_elements=layout.region_size,
        flat_buffers=1,
        bucket=copied * element_size,
    )


def ring_bytes(region_size: int, element_size: int, world_size: int) -> int:
    """Bytes one rank sends in one reduce-scatter or all-gather of whole regions (NCCL: padding included)."""
    return (world_size - 1) * region_size * element_size


def p2p_ring_bytes(lengths: Sequence[int], rank: int, element_size: int) -> tuple[int, int]:
    """(reduce-scatter, all-gather) bytes `rank` sends on gloo, where only each region's data travels.

    With L_i the data elements of region i and Psi = sum L_i: the reduce-scatter sends every region but
    the rank's own, (Psi - L_r) e; the all-gather every region but its right neighbour's, (Psi - L_{r+1}) e.
    """
    total, world_size = sum(lengths), len(lengths)
    if world_size == 1:
        return 0, 0
    return (total - lengths[rank]) * element_size, (total - lengths[(rank + 1) % world_size]) * element_size


def agreement_bytes(num_tensors: int, world_size: int, *, clipping: bool = True) -> int:
    """Bytes a rank sends in the ring all-reduce (2 (N-1)/N of the vector) that agrees on the step.

    The vector holds, per tensor, its norm (only when clip_grad_norm_ is called) and how many ranks had a
    gradient for it (a tensor none had is skipped), plus one fp16 overflow count.
    """
    entries = (2 if clipping else 1) * num_tensors + 1
    return (2 * (world_size - 1) * ENTRY_BYTES * entries) // world_size


def comm_bytes_per_step(
    layout: FlatLayout, rank: int, element_size: int, backend: str, *, lengths: Sequence[int] | None = None
) -> dict[str, int]:
    """Bytes `rank` sends per optimizer step (one accumulation boundary), by collective.

    Args:
        layout: the owner-ordered layout.
        rank: the sending rank.
        element_size: bytes per element of the model dtype.
        backend: "gloo" (our rings: data only) or "nccl" (torch's collectives: whole regions).
        lengths: elements of each region that travel (gloo; default: its trainable tensors).

    Returns:
        {"reduce_scatter", "all_gather", "all_reduce" (norms and flags, with clipping), "broadcast", "total"}.
    """
    world_size = layout.world_size
    if uses_p2p_backend(backend, world_size):
        scatter, gather = p2p_ring_bytes(lengths or layout.active_loads(), rank, element_size)
    else:
        scatter = gather = ring_bytes(layout.region_size, element_size, world_size)
    counts = dict(
        reduce_scatter=scatter,
        all_gather=gather,
        all_reduce=agreement_bytes(len(layout.numels), world_size),
        broadcast=0,
    )
    counts["total"] = sum(counts.values())
    return counts


def zero2_comm_bytes_per_step(
    layout: FlatLayout, rank: int, element_size: int, backend: str, *, micro_steps: int = 1
) -> dict[str, int]:
    """Bytes `rank` sends per optimizer step under our ZeRO-2, by collective.

    The buckets of every micro-step are reduced to their owners: on gloo our ring sends every region's
    data but the rank's own, (Psi - L_r) e per micro-step, the bytes of ZeRO-1's reduce-scatter; on NCCL a
    ring reduce per region sends about (N-1)/N of it. The all-gather of the parameters and the
    agreement all-reduce are ZeRO-1's.

    Args:
        layout: the owner-ordered layout.
        rank: the sending rank.
        element_size: bytes per element of the model dtype.
        backend: "gloo" or "nccl".
        micro_steps: gradient accumulation steps (each one reduces every bucket).

    Returns:
        {"reduce", "all_gather", "all_reduce", "broadcast", "total"}.
    """
    world_size, lengths = layout.world_size, layout.active_loads()
    counts = comm_bytes_per_step(layout, rank, element_size, backend, lengths=lengths)
    if uses_p2p_backend(backend, world_size):
        reduce = counts.pop("reduce_scatter")
    else:
        counts.pop("reduce_scatter")
        reduce = (world_size - 1) * sum(lengths) * element_size // world_size
    counts = dict(reduce=reduce * micro_steps, **counts)
    counts.pop("total")
    counts["total"] = sum(counts.values())
    return counts
