"""gloo's side of the collectives: our rings and exchanges of point-to-point messages (isend/irecv).

gloo's reduce_scatter_tensor is an all-reduce plus a copy underneath and its all_gather_into_tensor is slower
still, while a ring of isend/irecv moves the same buffer fastest (timings: docs/zero1.md). collectives.py
chooses between this file and nccl.py per backend.

The reduction ring (`ring_schedule`): part r is summed along the ranks r+1, r+2, ..., r, always in
that order, ((g[r+1] + g[r+2]) + ...) + g[r], the same on every run (deterministic), whatever the chunk
size. Each part travels in chunks that follow each other along the ring (a pipeline), so a bucket that
lies in one rank's slice does not cost N-1 sequential hops of its whole size. Bytes rank r sends per
reduction, with L_i the elements of part i, D = sum L_i and e bytes per element: (D - L_r) e, every part
but its own; the all-gather of equal slices sends (D - L_{r+1}) e. Summed over the ranks 2 (N-1) D e,
what DDP's ring all-reduce sends (the ZeRO paper's 2 Psi). accounting.py counts these bytes.

ZeRO-3's exchanges (`exchange_gather`, `exchange_reduce_scatter`): every rank posts its N-1 sends and N-1
receives at once (a direct exchange); the reduce-scatter adds what it received when waited for, in rank order
after its own part: 3-5x faster than gloo's own collectives on loopback
(docs/zero3.md#communication-3-psi-per-step). Their messages carry a tag per (unit, collective), so operations
in flight at the same time (a gather of the next block, a reduce-scatter of the last) never pair the wrong
buffers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from zero_train.sharding.comm.groups import global_rank, group_rank_and_size

RECV_BUFFER_ELEMENTS = 1 << 22
"""Largest receive buffer of a gloo reduction ring (16 MB in fp32), so it costs O(1), not Psi/N."""


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
    return ring_receive_elements_of(
        parts=len(lengths), nonempty=nonempty, total=sum(lengths), largest=max(lengths), limit=limit
    )


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


def ring_all_gather_(slices: torch.Tensor, process_group, lengths: list[int]) -> None:
    """The gloo all-gather ring: slice r of `slices` (N rows) travels from rank r to every rank; only the
    first `lengths[r]` elements of each slice (its data) are sent."""
    rank, world_size = group_rank_and_size(process_group)
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


def exchange_gather(slices: torch.Tensor, process_group, *, tag: int) -> list:
    """Post the receives of every other rank's slice and the sends of this rank's (ZeRO-3's gather); the works."""
    rank, world_size = group_rank_and_size(process_group)
    works = []
    for peer in range(world_size):
        if peer != rank:
            works.append(
                dist.irecv(slices[peer], src=global_rank(peer, process_group), group=process_group, tag=tag)
            )
    for peer in range(world_size):
        if peer != rank:
            works.append(
                dist.isend(slices[rank], dst=global_rank(peer, process_group), group=process_group, tag=tag)
            )
    return works


def exchange_reduce_scatter(slices: torch.Tensor, process_group, *, tag: int):
    """Send slice `peer` to each peer and receive their copies of this rank's slice (ZeRO-3's reduce-scatter).

    Returns:
        (works, finish): wait for the works, then `finish()` adds what was received into this rank's slice,
        in rank order after its own part.
    """
    rank, world_size = group_rank_and_size(process_group)
    peers = [peer for peer in range(world_size) if peer != rank]
    received = torch.empty((len(peers), slices.shape[1]), dtype=slices.dtype, device=slices.device)
    works = [
        dist.irecv(received[k], src=global_rank(peer, process_group), group=process_group, tag=tag)
        for k, peer in enumerate(peers)
    ]
    for peer in peers:
        works.append(
            dist.isend(slices[peer], dst=global_rank(peer, process_group), group=process_group, tag=tag)
        )

    def add_received() -> None:
        for k in range(len(peers)):
            slices[rank].add_(received[k])

    return works, add_received
