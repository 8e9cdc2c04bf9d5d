"""The few collectives the sharders use, on flat buffers whose rank parts are given as (starts, lengths).

Choice per backend: gloo's reduce_scatter_tensor is an all-reduce plus a copy underneath and its
all_gather_into_tensor is slower still, while a ring of isend/irecv moves the same buffer fastest (timings:
docs/zero1.md). So on gloo both the reduction and the all-gather are hand-written rings of point-to-point
messages; on NCCL (and any other backend) torch's own collectives are used: one reduce-scatter per
bucket (`reduce_scatter_parts`), `all_gather_into_tensor` over equal slices.

The gloo reduction ring (`ring_schedule`): part r is summed along the ranks r+1, r+2, ..., r, always in
that order, ((g[r+1] + g[r+2]) + ...) + g[r], the same on every run (deterministic), whatever the chunk
size. Each part travels in chunks that follow each other along the ring (a pipeline), so a bucket that
lies in one rank's slice does not cost N-1 sequential hops of its whole size. Bytes rank r sends per
reduction, with L_i the elements of part i, D = sum L_i and e bytes per element: (D - L_r) e, every part
but its own; the all-gather of equal slices sends (D - L_{r+1}) e. Summed over the ranks 2 (N-1) D e,
what DDP's ring all-reduce sends (the ZeRO paper's 2 Psi). accounting.py counts these bytes.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

TORCH_COLLECTIVES_ENV = "ZT_TORCH_COLLECTIVES"
"""Set to 1 to run torch's collectives (the path NCCL takes) on gloo too: how a CPU test exercises the NCCL
branch (tests/sharding/test_nccl.py), and how gloo's own collectives are timed against our rings."""

RECV_BUFFER_ELEMENTS = 1 << 22
"""Largest receive buffer of a gloo reduction ring (16 MB in fp32), so it costs O(1), not Psi/N."""


def group_rank_and_size(process_group=None) -> tuple[int, int]:
    """(rank, world size) of this process in `process_group` (None: the default group; (0, 1) if none)."""
    if process_group is None and not dist.is_initialized():
        return 0, 1
    return dist.get_rank(process_group), dist.get_world_size(process_group)


def uses_p2p_rings(process_group=None) -> bool:
    """True on gloo, whose reduce-scatter and all-gather are slower than our isend/irecv rings (unless
    $ZT_TORCH_COLLECTIVES=1 forces torch's collectives, the NCCL path)."""
    return dist.get_backend(process_group) == "gloo" and os.environ.get(TORCH_COLLECTIVES_ENV) != "1"


def backend_name(process_group=None) -> str:
    """The group's backend ("gloo", "nccl", ...); "gloo" without a process group (nothing travels)."""
    if process_group is None and not dist.is_initialized():
        return "gloo"
    return str(dist.get_backend(process_group))


def global_rank(rank: int, process_group) -> int:
    """The default group's rank of `rank` in `process_group` (what point-to-point calls take)."""
    return dist.get_global_rank(process_group, rank) if process_group is not None else rank


MIN_CHUNK_ELEMENTS = 1 << 16
"""Smallest chunk worth its own message: a gloo message's fixed cost is about what 64k fp32 elements take to move
(docs/zero1.md), so smaller buckets travel whole (N-1 ring steps)."""


def _senders(lengths: list[int]) -> int:
    """Chunks a rank may receive in one ring step: one per non-empty part, at most N - 1."""
    return _senders_of(len(lengths), sum(1 for length in lengths if length))


def _senders_of(parts: int, nonempty: int) -> int:
    return max(1, min(parts - 1, nonempty))


def ring_chunk(lengths: list[int], receive_elements: int) -> int:
    """Chunk size of a gloo reduction ring: an N-th of the data (equal parts then travel whole, as in a
    classic ring, and a part alone in the bucket is pipelined over N chunks), at least MIN_CHUNK_ELEMENTS, at
    most the largest part, and small enough that one step's receives fit `receive_elements`."""
    return _chunk_of(len(lengths), sum(lengths), max(lengths), _senders(lengths), receive_elements)


def _chunk_of(parts: int, total: int, largest: int, senders: int, receive_elements: int) -> int:
    per_part = max(-(-total // parts), MIN_CHUNK_ELEMENTS)
    return max(1, min(per_part, largest, receive_elements // senders))


def ring_receive_elements(lengths: list[int], limit: int | None = None) -> int:
    """Receive buffer a ring over these parts needs (one chunk per part sending in a step), within `limit`
    elements (default RECV_BUFFER_ELEMENTS)."""
    if len(lengths) < 2:
        return 0
    nonempty = sum(1 for length in lengths if length)
    return ring_receive_elements_of(parts=len(lengths), nonempty=nonempty, total=sum(lengths),
                                    largest=max(lengths), limit=limit)  # fmt: skip


def ring_receive_elements_of(
    *, parts: int, nonempty: int, total: int, largest: int, limit: int | None = None
) -> int:
    """`ring_receive_elements` from the parts' numbers alone (how many, how many hold data, their sum and the
    largest): the memory model's answer at any world size without a list of N lengths."""
    if parts < 2:
        return 0
    limit = RECV_BUFFER_ELEMENTS if limit is None else limit
    senders = _senders_of(parts, nonempty)
    return senders * _chunk_of(parts, total, largest, senders, limit)


def ring_schedule(
    starts: list[int], lengths: list[int], rank: int, chunk: int
) -> list[tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    """What `rank` sends right and receives from the left at each step of the reduction ring (pure).

    Part p travels in chunks j = 0, 1, ...; the rank at position k = (rank - p - 1) mod N along its path
    (k = 0: rank p+1, k = N-1: the owner p) receives chunk j at step k - 1 + j, adds it to its own, and
    (unless it is the owner) sends the sum on at step k + j.

    Returns:
        Per step: (sends, receives), each a list of (flat start, length) in part order; both neighbours
        compute the same lists, so the messages pair up in order.
    """
    world_size = len(lengths)
    chunks = [-(-length // chunk) for length in lengths]
    steps = max(chunks) + world_size - 2 if any(chunks) else 0
    schedule: list[tuple[list[tuple[int, int]], list[tuple[int, int]]]] = [([], []) for _ in range(steps)]
    for part in range(world_size):
        position = (rank - part - 1) % world_size
        for j in range(chunks[part]):
            piece = (starts[part] + j * chunk, min(chunk, lengths[part] - j * chunk))
            if position < world_size - 1:
                schedule[position + j][0].append(piece)
            if position > 0:
                schedule[position - 1 + j][1].append(piece)
    return schedule


def ring_reduce_(flat: torch.Tensor, recv_buffer: torch.Tensor, process_group, starts, lengths) -> None:
    """The gloo reduction ring (`ring_schedule`): part r of `flat` ends summed over the ranks on rank r."""
    rank, world_size = group_rank_and_size(process_group)
    right, left = (
        global_rank((rank + 1) % world_size, process_group),
        global_rank((rank - 1) % world_size, process_group),
    )
    chunk = ring_chunk(list(lengths), recv_buffer.numel())
    for sends, receives in ring_schedule(list(starts), list(lengths), rank, chunk):
        works, landed, filled = [], [], 0
        for start, length in receives:
            received = recv_buffer[filled : filled + length]
            works.append(dist.irecv(received, src=left, group=process_group))
            landed.append((start, received))
            filled += length
        for start, length in sends:
            works.append(dist.isend(flat[start : start + length], dst=right, group=process_group))
        for work in works:
            work.wait()
        for start, received in landed:
            flat[start : start + received.numel()].add_(received)


def reduce_to_owners_(
    flat: torch.Tensor,
    recv_buffer: torch.Tensor | None,
    process_group=None,
    *,
    starts,
    lengths,
    async_op=False,
):
    """Sum part r of `flat` (`starts[r]`, `lengths[r]`) over the ranks onto rank r (other parts: partial sums).

    gloo: our ring (synchronous; overlap.py runs it on a communication thread). Other backends: one
    `reduce_scatter_parts` (one collective for the whole bucket).

    Returns:
        With async_op (not gloo): the works to wait on; else an empty list.
    """
    rank, world_size = group_rank_and_size(process_group)
    if world_size == 1:
        return []
    if uses_p2p_rings(process_group):
        assert not async_op, "the gloo ring is synchronous"
        ring_reduce_(flat, recv_buffer, process_group, starts, lengths)
        return []
    work = reduce_scatter_parts(flat, process_group, starts=starts, lengths=lengths, async_op=async_op)
    return [work] if async_op else []


def reduce_scatter_parts(flat: torch.Tensor, process_group=None, *, starts, lengths, async_op=False):
    """ONE collective per bucket: part r of `flat` summed over the ranks into place on rank r.

    The parts are contiguous and in rank order (a bucket cut at the owners' boundaries), but unequal: only
    the ranks whose slice the bucket overlaps have one. Equal parts that fill the bucket go to
    `reduce_scatter_tensor` (NCCL's ReduceScatter, in place). Otherwise torch's `reduce_scatter` of the N
    parts: NCCL runs unequal ones as one group of N ncclReduce calls (ProcessGroupNCCL::reduce_scatter), one
    launch, each rank sending exactly its parts, as the old one-reduce-per-owner did in N launches. Padding
    every part to the largest would make it a ReduceScatter too, but sends N x the largest part: for a bucket
    inside one rank's slice, N times the bucket (docs/zero1.md#the-nccl-path).

    Returns:
        The work (with async_op), else None.
    """
    rank, _ = group_rank_and_size(process_group)
    parts = [flat[start : start + length] for start, length in zip(starts, lengths, strict=True)]
    if lengths[0] and all(length == lengths[0] for length in lengths):
        whole = flat[starts[0] : starts[0] + lengths[0] * len(lengths)]
        return dist.reduce_scatter_tensor(parts[rank], whole, group=process_group, async_op=async_op)
    return dist.reduce_scatter(parts[rank], parts, group=process_group, async_op=async_op)


def all_gather_(flat: torch.Tensor, process_group=None, *, lengths: list[int] | None = None) -> None:
    """Copy every rank's slice of `flat` to all ranks (in place: slice r comes from rank r).

    Args:
        flat: buffer of world_size equal slices; this rank's slice holds its values.
        process_group: the data-parallel group (None: default).
        lengths: elements at the start of each slice that carry data (gloo: only those travel);
            None: whole slices.
    """
    rank, world_size = group_rank_and_size(process_group)
    if world_size == 1:
        return
    slices = flat.view(world_size, -1)
    if not uses_p2p_rings(process_group):
        dist.all_gather_into_tensor(flat, slices[rank], group=process_group)
        return
    lengths = lengths or [slices.shape[1]] * world_size
    right, left = (
        global_rank((rank + 1) % world_size, process_group),
        global_rank((rank - 1) % world_size, process_group),
    )
    for step in range(world_size - 1):
        send_index, recv_index = (rank - step) % world_size, (rank - step - 1) % world_size
        works = []
        if lengths[recv_index]:
            works.append(dist.irecv(slices[recv_index, : lengths[recv_index]], src=left, group=process_group))
        if lengths[send_index]:
            works.append(
                dist.isend(slices[send_index, : lengths[send_index]], dst=right, group=process_group)
            )
        for work in works:
            work.wait()


def all_reduce_(tensor: torch.Tensor, process_group=None, op=dist.ReduceOp.SUM) -> None:
    """Reduce a small tensor (norms, flags) over the ranks, in place."""
    if group_rank_and_size(process_group)[1] > 1:
        dist.all_reduce(tensor, op=op, group=process_group)
