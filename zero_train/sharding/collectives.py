"""The few collectives Zero1Optimizer uses, each on a flat buffer of `world_size` equal regions.

Choice per backend (measured on this machine, gloo over loopback, 2 ranks, 64 MB fp32 buffer):
all_reduce 50 ms; gloo's reduce_scatter_tensor 97 ms (emulated as an all-reduce plus a copy: it moves
all-reduce traffic and more); gloo's all_gather_into_tensor 113 ms; a ring of isend/irecv that
reduce-scatters the same buffer 34 ms. So on gloo both the reduce-scatter and the all-gather are
hand-written rings of point-to-point messages; on NCCL (and any other backend) torch's own
reduce_scatter / all_gather over the same flat buffer are used, which are real rings already.

The gloo rings send only the data of each region, never its padding (`lengths`: the elements of each
region that carry parameters; whole tensors per owner leave the regions unequal). Bytes rank r sends per
call, with L_i the data elements of region i, Psi = sum L_i and e bytes per element:
    reduce_scatter_: (Psi - L_r) e          (every region but its own)
    all_gather_:     (Psi - L_{r+1}) e      (every region but its right neighbour's)
Together 2 Psi e - (L_r + L_{r+1}) e: summed over the ranks 2 (N-1) Psi e, exactly what DDP's ring
all-reduce sends in total (the ZeRO paper's 2 Psi); at N = 2 every rank sends exactly Psi e, as in DDP.
On NCCL the regions travel whole (equal chunks: padding included). accounting.py counts these bytes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def group_rank_and_size(process_group=None) -> tuple[int, int]:
    """(rank, world size) of this process in `process_group` (None: the default group; (0, 1) if none)."""
    if process_group is None and not dist.is_initialized():
        return 0, 1
    return dist.get_rank(process_group), dist.get_world_size(process_group)


def uses_p2p_rings(process_group=None) -> bool:
    """True on gloo, whose reduce-scatter and all-gather are slower than our isend/irecv rings."""
    return dist.get_backend(process_group) == "gloo"


def backend_name(process_group=None) -> str:
    """The group's backend ("gloo", "nccl", ...); "gloo" without a process group (nothing travels)."""
    if process_group is None and not dist.is_initialized():
        return "gloo"
    return str(dist.get_backend(process_group))


def _exchange(send: torch.Tensor, recv: torch.Tensor, *, to_rank: int, from_rank: int, process_group) -> None:
    """Send `send` to `to_rank` while receiving `recv` from `from_rank` (group ranks); empty ones are skipped."""
    to_global = dist.get_global_rank(process_group, to_rank) if process_group is not None else to_rank
    from_global = dist.get_global_rank(process_group, from_rank) if process_group is not None else from_rank
    receiving = dist.irecv(recv, src=from_global, group=process_group) if recv.numel() else None
    sending = dist.isend(send, dst=to_global, group=process_group) if send.numel() else None
    for work in (sending, receiving):
        if work is not None:
            work.wait()


def reduce_scatter_(
    flat: torch.Tensor,
    recv_buffer: torch.Tensor | None,
    process_group=None,
    *,
    lengths: list[int] | None = None,
) -> None:
    """Sum `flat` over the ranks into this rank's region of `flat` (other regions: partial sums).

    Ring order on gloo: region r is summed starting at rank r+1, then r+2, ..., ending with rank r's
    own values, ((g[r+1] + g[r+2]) + ...) + g[r], the same on every run (deterministic).

    Args:
        flat: buffer of world_size equal regions (modified in place).
        recv_buffer: scratch for the incoming messages (gloo only; may be None elsewhere); a region
            travels in pieces of its size, so it may be smaller than a region.
        process_group: the data-parallel group (None: default).
        lengths: elements at the start of each region that carry data (gloo: the rest, padding, is
            neither sent nor summed); None: whole regions.
    """
    rank, world_size = group_rank_and_size(process_group)
    if world_size == 1:
        return
    region_size = flat.numel() // world_size
    if not uses_p2p_rings(process_group):
        dist.reduce_scatter_tensor(flat.view(world_size, -1)[rank], flat, group=process_group)
        return
    starts = [r * region_size for r in range(world_size)]
    _ring_reduce_(flat, recv_buffer, process_group, starts, lengths or [region_size] * world_size)


def reduce_to_owners_(
    flat: torch.Tensor,
    recv_buffer: torch.Tensor | None,
    process_group=None,
    *,
    starts: list[int],
    lengths: list[int],
) -> None:
    """Sum region r of `flat` (`starts[r]`, `lengths[r]`: unequal, unpadded) over the ranks onto rank r.

    ZeRO-2's bucket reduction. On gloo the same ring as reduce_scatter_ (same summation order, only the
    data travels); elsewhere one torch reduce per non-empty region, to its owner.
    """
    rank, world_size = group_rank_and_size(process_group)
    if world_size == 1:
        return
    if uses_p2p_rings(process_group):
        _ring_reduce_(flat, recv_buffer, process_group, starts, lengths)
        return
    for owner, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        if length:
            dst = dist.get_global_rank(process_group, owner) if process_group is not None else owner
            dist.reduce(flat[start : start + length], dst=dst, group=process_group)


def _ring_reduce_(flat, recv_buffer, process_group, starts: list[int], lengths: list[int]) -> None:
    """The gloo ring: N-1 exchanges with the neighbours; region r ends summed on rank r."""
    assert recv_buffer is not None
    rank, world_size = group_rank_and_size(process_group)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    piece = recv_buffer.numel()  # a region travels in pieces of the receive buffer's size
    for step in range(world_size - 1):
        send_index = (rank - step - 1) % world_size
        recv_index = (rank - step - 2) % world_size  # what the left neighbour sends: its send_index
        send_length, recv_length = lengths[send_index], lengths[recv_index]
        send_start, recv_start = starts[send_index], starts[recv_index]
        for start in range(0, max(send_length, recv_length), piece):
            received = recv_buffer[: max(0, min(start + piece, recv_length) - start)]
            send_stop = send_start + max(start, min(start + piece, send_length))
            send = flat[send_start + start : send_stop]
            _exchange(send, received, to_rank=right, from_rank=left, process_group=process_group)
            flat[recv_start + start : recv_start + start + received.numel()].add_(received)


def all_gather_(flat: torch.Tensor, process_group=None, *, lengths: list[int] | None = None) -> None:
    """Copy every rank's region of `flat` to all ranks (in place: region r comes from rank r).

    Args:
        flat: buffer of world_size equal regions; this rank's region holds its values.
        process_group: the data-parallel group (None: default).
        lengths: elements at the start of each region that carry data (gloo: only those travel);
            None: whole regions.
    """
    rank, world_size = group_rank_and_size(process_group)
    if world_size == 1:
        return
    regions = flat.view(world_size, -1)
    if not uses_p2p_rings(process_group):
        dist.all_gather_into_tensor(flat, regions[rank], group=process_group)
        return
    lengths = lengths or [regions.shape[1]] * world_size
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(world_size - 1):
        send_index = (rank - step) % world_size
        recv_index = (rank - step - 1) % world_size
        _exchange(
            regions[send_index, : lengths[send_index]],
            regions[recv_index, : lengths[recv_index]],
            to_rank=right,
            from_rank=left,
            process_group=process_group,
        )


def all_reduce_sum_(tensor: torch.Tensor, process_group=None) -> None:
    """Sum a small tensor (norms, overflow flags) over the ranks, in place."""
    if group_rank_and_size(process_group)[1] > 1:
        dist.all_reduce(tensor, group=process_group)


RECV_BUFFER_ELEMENTS = 1 << 22
"""Largest receive buffer of the gloo reduce-scatter ring (16 MB in fp32), so it costs O(1), not Psi/N."""
