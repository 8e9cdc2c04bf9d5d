"""Bucket reductions started during backward and finished in order: the communication behind the compute.

    queue = ReductionQueue(process_group, recv_buffer)
    queue.launch(flat, starts, lengths, on_done=add_to_owned)   # from a gradient hook: returns at once
    ...                                                         # backward goes on computing
    queue.wait_all()                                            # once, when backward ends

NCCL (and any backend but gloo): each launch issues one reduce-scatter of the bucket (async_op=True) on
NCCL's stream and keeps its handle; waiting makes the current stream wait for them (a collective with
async_op=False would join the streams at once and stall the backward of the layers below, the pattern of
DDP's and DeepSpeed's overlap_comm). gloo: gloo's send and receive handles cannot be polled (is_completed
stays False until wait()), so our ring (gloo.ring_reduce_) runs on one communication thread, the
launched reductions one after the other, in launch order on every rank, so the rings' messages pair up.

`on_done` runs on the caller's thread when the reduction is waited for (ZeRO-2 adds the owned part to
its accumulator there), in launch order.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from zero_train.sharding.comm import collectives, gloo
from zero_train.sharding.comm.groups import group_rank_and_size


class ReductionQueue:
    """Reductions to the owners in flight, oldest first.

    Args:
        process_group: the data-parallel group.
        recv_buffer: the gloo ring's receive buffer (None on other backends or with one rank).
    """

    def __init__(self, process_group, recv_buffer: torch.Tensor | None):
        self.process_group = process_group
        self.rank, self.world_size = group_rank_and_size(process_group)
        self.rings = self.world_size > 1 and collectives.uses_p2p_rings(process_group)
        self.recv_buffer = recv_buffer
        self._pending: deque[tuple[Future | list, Callable[[], None] | None]] = deque()
        self._thread: ThreadPoolExecutor | None = None

    def launch(
        self, flat: torch.Tensor, starts, lengths, *, on_done: Callable[[], None] | None = None
    ) -> None:
        """Start summing part r of `flat` over the ranks onto rank r; returns without waiting."""
        if self.world_size == 1:
            self._pending.append(([], on_done))
            return
        if self.rings:
            ring = (flat, self.recv_buffer, self.process_group, list(starts), list(lengths))
            self._pending.append((self._executor().submit(gloo.ring_reduce_, *ring), on_done))
            return
        works = collectives.reduce_to_owners_(
            flat, None, self.process_group, starts=list(starts), lengths=list(lengths), async_op=True
        )
        self._pending.append((works, on_done))

    def fit_receive_buffer(self, bucket_lengths: list[list[int]], *, dtype, device) -> None:
        """Size the gloo ring's receive buffer for the largest of these buckets (each rank's part lengths)."""
        if self.rings:
            elements = max((gloo.ring_receive_elements(lengths) for lengths in bucket_lengths), default=1)
            self.recv_buffer = torch.empty(elements, dtype=dtype, device=device)

    def _executor(self) -> ThreadPoolExecutor:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zero-reduce")
            weakref.finalize(self, self._thread.shutdown, wait=False)
        return self._thread

    @property
    def in_flight(self) -> int:
        """Reductions launched and not yet waited for."""
        return len(self._pending)

    def wait_oldest(self) -> None:
        """Finish the oldest reduction in flight (and run its on_done)."""
        handle, on_done = self._pending.popleft()
        if isinstance(handle, Future):
            handle.result()  # re-raises the communication thread's exception here
        else:
            for work in handle:
                work.wait()
        if on_done is not None:
            on_done()

    def wait_all(self) -> None:
        """Finish every reduction in flight, in launch order."""
        while self._pending:
            self.wait_oldest()
