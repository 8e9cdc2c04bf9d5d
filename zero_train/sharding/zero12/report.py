"""What a ZeRO-1/2 optimizer holds and sends: bytes by category, bytes per step, balance, where its pieces lie.

Functions of a Zero1Optimizer or Zero2Optimizer, which does not import them: the engines, the memory probe, the
tests and the tools call them. They read the segments, the stores and the inner optimizer, and call
accounting.py, the pure arithmetic the memory model and the report share.
"""

from __future__ import annotations

import torch

from zero_train.sharding import accounting, state_dict
from zero_train.sharding.comm.buckets import Bucket
from zero_train.sharding.comm.groups import backend_name
from zero_train.sharding.partition import FlatPartition
from zero_train.sharding.zero12.sharded import ShardedOptimizer
from zero_train.sharding.zero12.zero2 import Zero2Optimizer


def _nbytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def partitions(optimizer: ShardedOptimizer) -> list[FlatPartition]:
    """The FlatPartition of every segment, oldest first (usually one: the model as built)."""
    return [segment.partition for segment in optimizer.segments]


def buckets(optimizer: ShardedOptimizer) -> list[Bucket]:
    """The buckets every rank reduces, in the order it reduces them."""
    return [store.buckets[k] for store, k in optimizer._schedule.order]


def pieces_of(optimizer: ShardedOptimizer, param: torch.Tensor) -> list[tuple[int, int, int]]:
    """(rank, first element, length) of every piece of `param`, in element order ([]: never trainable)."""
    for segment in optimizer.segments:
        for index, known in enumerate(segment.params):
            if known is param:
                return [
                    (r, p.tensor_offset, p.length) for r, p in state_dict.pieces_of(segment.partition, index)
                ]
    return []


def balance_report(optimizer: ShardedOptimizer) -> dict:
    """How evenly the parameters are spread over the ranks, summed over the segments (accounting.balance_report)."""
    return accounting.balance_report(partitions(optimizer), optimizer._params[0].element_size())


def buffer_bytes(optimizer: ShardedOptimizer) -> accounting.BufferBytes:
    """The padding of the flat buffers (ZeRO-1: parameters and gradients; ZeRO-2: parameters), ZeRO-2's two
    bucket buffers, the gloo ring's receive buffer."""
    zero2 = isinstance(optimizer, Zero2Optimizer)
    bucket = 2 * optimizer._buffers.size * _element_size(optimizer._stores[0].reduce_dtype) if zero2 else 0
    recv_buffer = optimizer._queue.recv_buffer
    receive = recv_buffer.numel() if recv_buffer is not None else 0
    return accounting.BufferBytes(
        padding=sum(accounting.padding(s.partition) for s in optimizer.segments)
        * optimizer._params[0].element_size(),
        receive_elements=receive,
        receive=receive * recv_buffer.element_size() if recv_buffer is not None else 0,
        partition_elements=sum(s.partition.partition_size for s in optimizer.segments),
        flat_buffers=1 if zero2 else 2,
        bucket=bucket,
    )


def _grad_bytes(optimizer: ShardedOptimizer) -> int:
    """Model-dtype gradients held now: ZeRO-1's flat buffers without padding, ZeRO-2's owned accumulators
    (Psi/N), plus any gradient outside them (computed before the optimizer existed, or not yet in a bucket)."""
    stores = optimizer._stores
    if isinstance(optimizer, Zero2Optimizer):
        held = [store.owned for store in stores]
        loads = sum(s.segment.partition.loads()[optimizer.rank] for s in stores)
        kept = loads * held[0].element_size()
    else:
        held = [store.buffer for store in stores]
        kept = sum(
            (s.buffer.numel() - accounting.padding(s.segment.partition)) * s.buffer.element_size()
            for s in stores
        )
    ends = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in held]
    loose = sum(
        _nbytes(p.grad)
        for p in {id(p): p for g in optimizer.param_groups for p in g["params"]}.values()
        if p.grad is not None and not any(low <= p.grad.data_ptr() < high for low, high in ends)
    )
    return kept + loose


def memory_bytes(optimizer: ShardedOptimizer) -> dict[str, int]:
    """Bytes this rank holds, by category (params, grads, master_params, optimizer_states, comm_buffers).

    params: every model parameter (whole model, every rank). grads: the model-dtype gradients this stage keeps,
    plus fp32 master gradients while they exist. master_params: the fp32 masters of this rank's slices (mixed
    precision only). optimizer_states: the inner optimizer's tensors (this rank's pieces only). comm_buffers:
    padding of the flat buffers, buckets, receive buffer (`buffer_bytes`).
    """
    all_params = list({id(p): p for g in optimizer.param_groups for p in g["params"]}.values())
    mixed = any(s.has_master_copies for s in optimizer.segments)
    master_grads = sum(_nbytes(g) for g in optimizer._master_grads()) if mixed else 0
    states = optimizer.inner.state.values()
    return dict(
        params=sum(_nbytes(p) for p in all_params),
        grads=_grad_bytes(optimizer) + master_grads,
        master_params=sum(_nbytes(s.master) for s in optimizer.segments if s.has_master_copies),
        optimizer_states=sum(_nbytes(v) for state in states for v in state.values() if torch.is_tensor(v)),
        comm_buffers=buffer_bytes(optimizer).comm_buffers,
    )


def comm_bytes_per_step(optimizer: ShardedOptimizer, micro_steps: int = 1) -> dict[str, int]:
    """Bytes this rank sends per step with clipping (accounting.comm_bytes_per_step of every segment).

    Args:
        micro_steps: backward passes per step: ZeRO-2 reduces its gradients in each of them.
    """
    element_size = optimizer._params[0].element_size()
    every_backward = isinstance(optimizer, Zero2Optimizer)
    totals: dict[str, int] = {}
    for segment in optimizer.segments:
        counts = accounting.comm_bytes_per_step(
            segment.partition,
            optimizer.rank,
            element_size,
            backend_name(optimizer.process_group),
            active=segment.active,
            micro_steps=micro_steps if every_backward else 1,
            reduce_element_size=_element_size(optimizer._stores[0].reduce_dtype),
        )
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
    world_size = optimizer.world_size
    agreement = accounting.agreement_bytes(len(optimizer._params), world_size) if world_size > 1 else 0
    totals["total"] += agreement - totals["all_reduce"]
    totals["all_reduce"] = agreement  # one all-reduce for all segments
    return totals
