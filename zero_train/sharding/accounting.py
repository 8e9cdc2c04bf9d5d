"""What a Zero1Optimizer holds in memory and sends per step (for the memory reports and benchmarks).

Bytes per parameter for Adam (K = 8 bytes of state per parameter, N ranks, no padding):
    fp32 model:       4 (params) + 4 (grads) + 8/N (exp_avg, exp_avg_sq)          = 8 + 8/N
    bf16/fp16 model:  2 (params) + 2 (grads) + (4 master + 8 state)/N             = 4 + 12/N
the ZeRO paper's P_os row (2 + 2 + K/N with K = 12 in mixed precision).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from zero_train.sharding.collectives import p2p_ring_bytes, ring_bytes, uses_p2p_rings

if TYPE_CHECKING:
    from zero_train.sharding.zero1 import Zero1Optimizer


def _nbytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


def memory_bytes(optimizer: Zero1Optimizer) -> dict[str, int]:
    """Bytes this rank holds, by category.

    params: every model parameter (whole model, every rank). grads: the flat gradient buffer (the
    gradients are views into it) minus padding, plus any gradient not yet moved into it, plus fp32
    master gradients while they exist. master_params: the owned fp32 masters (mixed precision only).
    optimizer_states: the inner optimizer's tensors (owned parameters only). comm_buffers: padding of
    the two flat buffers and the ring's receive buffer.
    """
    all_params = list({id(p): p for g in optimizer.param_groups for p in g["params"]}.values())
    slots = optimizer._grad_slots
    element_size = optimizer._grad_buffer.element_size()
    padding = optimizer.layout.padding() * element_size
    loose_grads = sum(
        _nbytes(p.grad)
        for p in all_params
        if p.grad is not None and (id(p) not in slots or p.grad.data_ptr() != slots[id(p)].data_ptr())
    )
    master_grads = sum(_nbytes(m.grad) for m in optimizer._masters) if optimizer.has_master_copies else 0
    states = sum(
        _nbytes(v)
        for state in optimizer._inner.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )
    return dict(
        params=sum(_nbytes(p) for p in all_params),
        grads=_nbytes(optimizer._grad_buffer) - padding + loose_grads + master_grads,
        master_params=_nbytes(optimizer._master_flat) if optimizer.has_master_copies else 0,
        optimizer_states=states,
        comm_buffers=2 * padding + _nbytes(optimizer._recv_buffer),
    )


def comm_bytes_per_step(optimizer: Zero1Optimizer) -> dict[str, int]:
    """Bytes this rank sends per optimizer step (ring algorithms).

    reduce_scatter and all_gather: on gloo our p2p rings send every region's data but one (no
    padding: collectives.p2p_ring_bytes), elsewhere (N-1) whole regions each; all_reduce: the vector
    of per-tensor gradient norms (4 bytes per tensor, 2(N-1)/N of it sent by a ring) when
    clip_grad_norm_ is called.
    """
    world_size = optimizer.world_size
    element_size = optimizer._grad_buffer.element_size()
    if world_size > 1 and uses_p2p_rings(optimizer.process_group):
        scatter, gather = p2p_ring_bytes(optimizer.layout.loads(), optimizer.rank, element_size)
    else:
        scatter = gather = ring_bytes(optimizer.layout.region_size, element_size, world_size)
    norms = (2 * (world_size - 1) * 4 * len(optimizer._params)) // world_size
    counts = dict(reduce_scatter=scatter, all_gather=gather, all_reduce=norms, broadcast=0)
    counts["total"] = sum(counts.values())
    return counts
