"""What a sharder reports about itself: bytes held by category, bytes sent per step, how even the slices are.

ShardedOptimizer (sharded.py) subclasses ShardedReport; its methods read the segments, the inner optimizer and
the receive buffer and call accounting.py, the pure arithmetic the memory model and the report share.
"""

from __future__ import annotations

import torch

from zero_train.sharding import accounting
from zero_train.sharding.comm.overlap import ReductionQueue
from zero_train.sharding.partition import balance_report
from zero_train.sharding.step import PieceOptimizer
from zero_train.sharding.zero12.segments import Segment


class ShardedReport(PieceOptimizer):
    """memory_bytes(), comm_bytes_per_step(), balance_report(), pieces_of() of a ShardedOptimizer, which
    subclasses it and sets the attributes declared here."""

    reduces_every_backward: bool
    """ZeRO-2: every backward reduces its gradients (ZeRO-1: only the step's last one)."""
    backend: str
    """The group's backend ("gloo", "nccl", ...)."""
    _segments: list[Segment]
    """Every segment, oldest first; `_params` is their parameters, in segment order."""
    _queue: ReductionQueue
    """The bucket reductions in flight (and the gloo rings' receive buffer)."""

    def _gradient_dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        """(accumulation, reduction) dtype of the gradients (ShardedOptimizer's)."""
        raise NotImplementedError

    def _grad_bytes(self) -> int:
        """Bytes of model-dtype gradients this rank holds now (without padding or comm buffers)."""
        raise NotImplementedError

    def buffer_bytes(self) -> accounting.BufferBytes:
        """This optimizer's buffers (padding, buckets, receive buffer), summed over its segments."""
        raise NotImplementedError

    def _buffer_bytes(self, *, flat_buffers: int, bucket: int = 0) -> accounting.BufferBytes:
        """The padding of every segment's flat buffers, the bucket buffers, the gloo ring's receive buffer."""
        element_size = self._params[0].element_size()
        recv_buffer = self._queue.recv_buffer
        receive = recv_buffer.numel() if recv_buffer is not None else 0
        return accounting.BufferBytes(
            padding=sum(s.partition.padding() for s in self._segments) * element_size,
            receive_elements=receive,
            receive=receive * recv_buffer.element_size() if recv_buffer is not None else 0,
            partition_elements=sum(s.partition.partition_size for s in self._segments),
            flat_buffers=flat_buffers,
            bucket=bucket,
        )

    def _loose_grad_bytes(self, held: list[torch.Tensor]) -> int:
        """Bytes of gradients outside the stores' buffers `held` (e.g. computed before the optimizer existed, or
        not yet taken into a bucket), each parameter once."""
        ends = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in held]
        return sum(
            _nbytes(p.grad)
            for p in {id(p): p for g in self.param_groups for p in g["params"]}.values()
            if p.grad is not None and not any(low <= p.grad.data_ptr() < high for low, high in ends)
        )

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds, by category (params, grads, master_params, optimizer_states, comm_buffers).

        params: every model parameter (whole model, every rank). grads: the model-dtype gradients this
        stage keeps, plus fp32 master gradients while they exist. master_params: the fp32 masters of this
        rank's slices (mixed precision only). optimizer_states: the inner optimizer's tensors (this rank's
        pieces only). comm_buffers: padding of the flat buffers, buckets, receive buffer (`buffer_bytes()`).
        """
        all_params = list({id(p): p for g in self.param_groups for p in g["params"]}.values())
        mixed = any(s.has_master_copies for s in self._segments)
        master_grads = sum(_nbytes(g) for g in self._master_grads()) if mixed else 0
        states = sum(
            _nbytes(v)
            for state in self._inner.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        )
        return dict(
            params=sum(_nbytes(p) for p in all_params),
            grads=self._grad_bytes() + master_grads,
            master_params=sum(_nbytes(s.master) for s in self._segments if s.has_master_copies),
            optimizer_states=states,
            comm_buffers=self.buffer_bytes().comm_buffers,
        )

    def comm_bytes_per_step(self, micro_steps: int = 1) -> dict[str, int]:
        """Bytes this rank sends per step with clipping (accounting.comm_bytes_per_step of every segment).

        Args:
            micro_steps: backward passes per step: ZeRO-2 reduces its gradients in each of them.
        """
        element_size = self._params[0].element_size()
        totals: dict[str, int] = {}
        for segment in self._segments:
            counts = accounting.comm_bytes_per_step(
                segment.partition,
                self.rank,
                element_size,
                self.backend,
                active=segment.active,
                micro_steps=micro_steps if self.reduces_every_backward else 1,
                reduce_element_size=torch.empty(0, dtype=self._gradient_dtypes()[1]).element_size(),
            )
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value
        agreement = (
            accounting.agreement_bytes(len(self._params), self.world_size) if self.world_size > 1 else 0
        )
        totals["total"] += agreement - totals["all_reduce"]
        totals["all_reduce"] = agreement  # one all-reduce for all segments
        return totals

    @property
    def partitions(self) -> list:
        """The FlatPartition of every segment, oldest first (usually one: the model as built)."""
        return [segment.partition for segment in self._segments]

    def pieces_of(self, param: torch.Tensor) -> list[tuple[int, int, int]]:
        """(rank, first element, length) of every piece of `param`, in element order ([]: never trainable)."""
        for segment in self._segments:
            for index, known in enumerate(segment.params):
                if known is param:
                    return [(r, p.tensor_offset, p.length) for r, p in segment.partition.pieces_of(index)]
        return []

    def balance_report(self) -> dict:
        """How evenly the parameters are spread over the ranks, summed over the segments
        (partition.balance_report)."""
        return balance_report(self.partitions, self._params[0].element_size())


def _nbytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()
