"""What Zero3Optimizer holds, by category: a function of the optimizer, which does not import it (the engine calls it)."""

from __future__ import annotations

import torch

from zero_train.sharding.zero3.optim import Zero3Optimizer


def memory_bytes(optimizer: Zero3Optimizer) -> dict[str, int]:
    """Bytes this rank holds by category: params (slices + gathered buffers alive), grads (gradient slices,
    fp32 master gradients, whole gradients not reduced yet), master_params (fp32 slices, mixed precision),
    optimizer_states (the inner optimizer's), comm_buffers (the reduction in flight)."""
    sharded = optimizer.sharded
    loose = sum(_nbytes(p.grad) for p in sharded.parameters())
    grads = sum(_nbytes(u.grad) for u in sharded.units) + loose
    if optimizer.has_master_copies:
        grads += sum(_nbytes(g) for g in optimizer._master_grads())
    states = sum(_nbytes(v) for s in optimizer.inner.state.values() for v in s.values() if torch.is_tensor(v))
    masters = sum(_nbytes(m) for m in optimizer.masters.values()) if optimizer.has_master_copies else 0
    return dict(
        params=sum(_nbytes(u.shard) for u in sharded.units) + sharded.gathered_bytes(),
        grads=grads,
        master_params=masters,
        optimizer_states=states,
        comm_buffers=sharded.reducer.in_flight_bytes(),
    )


def _nbytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()
