"""Gathering sharded tensors onto ONE rank, in its CPU memory, one tensor at a time.

Checkpoints and exports need the full fp32 masters and the full optimizer state on the rank that writes
them, and nowhere else. An all-gather (or `gather_object` of whole shards) would hold the whole model on
every rank, ~4 Psi extra bytes each in fp32, and `gather_object` unpickles other ranks' CUDA tensors onto
their devices. Here each tensor travels alone, point to point from its owner to the writing rank, and
lands in CPU memory there:

    owner:      isend(the tensor, on the communication device)    one extra tensor at most
    receiver:   irecv into one tensor on the communication device, then copy it to CPU
    others:     nothing

Each message is a batch of one (`batch_isend_irecv`): on NCCL a batched point-to-point runs on the
group's own communicator, where a plain send/recv builds a dedicated 2-rank communicator per pair
(seconds each, buffers outside the allocator). The group must have run a collective before (NCCL
creates its communicator on a call every rank makes); training and gather_objects_to always have.
The communication device is this rank's CUDA device on NCCL (which moves only device memory) and the CPU
on every other backend (gloo's point-to-point messages are CPU tensors). Every rank walks the same list in
the same order, so sends and receives pair up without tags.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from zero_train.sharding.comm.groups import global_rank, group_rank_and_size


def comm_device(process_group=None) -> torch.device:
    """Where point-to-point messages travel: this rank's CUDA device on NCCL, the CPU on other backends."""
    if dist.is_initialized() and dist.get_backend(process_group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached copy in CPU memory (never a view of the original, even if it is on the CPU already)."""
    return tensor.detach().to("cpu", copy=True)


def _exchange(op, tensor: torch.Tensor, *, peer: int, process_group) -> None:
    """One isend or irecv with group rank `peer`, as a batch of one (the group's communicator), waited."""
    for work in dist.batch_isend_irecv([dist.P2POp(op, tensor, group=process_group, group_peer=peer)]):
        work.wait()


def send_tensor(tensor: torch.Tensor, *, to: int, process_group=None) -> None:
    """Send one tensor to group rank `to` (blocking), through the communication device."""
    travel = tensor.detach().to(comm_device(process_group)).contiguous()
    _exchange(dist.isend, travel, peer=to, process_group=process_group)


def receive_tensor(shape, dtype: torch.dtype, *, owner: int, process_group=None) -> torch.Tensor:
    """Receive one tensor of `shape`/`dtype` from group rank `owner`; returned in CPU memory."""
    received = torch.empty(tuple(shape), dtype=dtype, device=comm_device(process_group))
    _exchange(dist.irecv, received, peer=owner, process_group=process_group)
    return received.cpu()


def gather_tensor(
    tensor: torch.Tensor | None, *, owner: int, to: int, shape, dtype: torch.dtype, process_group=None
) -> torch.Tensor | None:
    """One tensor from its owner onto rank `to`, as a CPU copy (None on every other rank).

    Every rank of the group calls it; only `owner` and `to` communicate (one send, one receive).

    Args:
        tensor: the owner's tensor (ignored on the other ranks).
        owner: group rank holding `tensor`.
        to: group rank receiving it.
        shape: the tensor's shape, known on every rank.
        dtype: the tensor's dtype, known on every rank.
        process_group: the group (None: the default group).

    Returns:
        On `to`: a new CPU tensor equal to the owner's. Elsewhere: None.
    """
    rank, _ = group_rank_and_size(process_group)
    if rank == owner == to:
        return cpu_copy(tensor)
    if rank == owner:
        send_tensor(tensor, to=to, process_group=process_group)
    elif rank == to:
        return receive_tensor(shape, dtype, owner=owner, process_group=process_group)
    return None


class TensorSpec(tuple):
    """(shape, dtype name): a tensor's stand-in in a pickled skeleton (small, no device)."""


def map_tensors(value: Any, fn: Callable[[Any], Any], *, leaf: type = torch.Tensor) -> Any:
    """`value` with `fn` applied to every `leaf` inside dicts, lists and tuples (depth first, in order)."""
    if isinstance(value, leaf):
        return fn(value)
    if isinstance(value, dict):
        return {key: map_tensors(item, fn, leaf=leaf) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(item, fn, leaf=leaf) for item in value)
    return value


def _spec(tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec((tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")))


def gather_objects_to(obj: Any, *, to: int, process_group=None) -> list[Any] | None:
    """Every rank's `obj` (tensors inside included) on rank `to`, tensors as CPU copies; None elsewhere.

    The structure travels pickled WITHOUT its tensors (shape and dtype only: `gather_object`); then each
    tensor follows alone, point to point. Peak per rank: one tensor beyond what it holds already, plus,
    on `to`, the gathered result in CPU memory.

    Args:
        obj: this rank's object: dicts, lists and tuples of tensors and picklable values.
        to: group rank receiving everything.
        process_group: the group (None: the default group; a world of one if not initialised).

    Returns:
        On `to`: the list of every rank's object, by group rank. Elsewhere: None.
    """
    rank, world_size = group_rank_and_size(process_group)
    if world_size == 1:
        return [map_tensors(obj, cpu_copy)]
    skeletons: list[Any] | None = [None] * world_size if rank == to else None
    dst = global_rank(to, process_group)
    dist.gather_object(map_tensors(obj, _spec), skeletons, dst=dst, group=process_group)
    if rank != to:
        map_tensors(obj, lambda tensor: send_tensor(tensor, to=to, process_group=process_group))
        return None

    def receiver(owner: int) -> Callable[[TensorSpec], torch.Tensor]:
        def receive(spec: TensorSpec) -> torch.Tensor:
            shape, dtype_name = spec
            return receive_tensor(shape, getattr(torch, dtype_name), owner=owner, process_group=process_group)

        return receive

    return [  # by rank: rank r+1's sends wait until rank r's are all received
        map_tensors(obj, cpu_copy)
        if owner == to
        else map_tensors(skeletons[owner], receiver(owner), leaf=TensorSpec)
        for owner in range(world_size)
    ]
