"""Bucket reductions started during backward and finished in order: the communication behind the compute.

    queue = ReductionQueue(process_group, recv_buffer)
    queue.launch(flat, starts, lengths, on_done=add_to_owned)   # from a gradient hook: returns at once
    ...                                                         # backward goes on computing
    queue.wait_all()                                            # once, when backward ends

NCCL (and any backend but gloo): each launch issues one reduce-scatter of the bucket (async_op=True) on
NCCL's stream and keeps its handle; waiting makes the current stream wait for them (a collective with
async_op=False would join the streams at once and stall the backward of the layers below, the pattern of
DDP's and DeepSpeed's overlap_comm). gloo: gloo's send and receive handles cannot be polled (is_completed
stays False until wait()), so our ring (collectives.ring_reduce_) runs on one communication thread, the
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

from zero_train.sharding import collectives


class ReductionQueue:
    """Reductions to the owners in flight, oldest first.

    Args:
        process_group: the data-parallel group.
        recv_buffer: the gloo ring's receive buffer (None on other backends or with one rank).
    """

    def __init__(self, process_group, recv_buffer: torch.Tensor | None):
        self.process_group = process_group
        self.rank, self.world_size = collectives.group_rank_and_size(process_group)
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
            self._pending.append((self._executor().submit(collectives.ring_reduce_, *ring), on_done))
            return
        works = collectives.reduce_to_owners_(
            flat, None, self.process_group, starts=list(starts), lengths=list(lengths), async_op=True
        )
        self._pending.append((works, on_done))

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


class BucketSchedule:
    """Every segment's buckets in one order, the same on every rank: a bucket is launched once it and every
    bucket before it are complete, so all ranks issue their reductions in the same order even when their
    backward passes produce gradients in different orders (a branch only some ranks take).

    The newest segment's buckets come first (parameters added or unfrozen later sit nearer the output, in
    the usual progressive-unfreezing or layer-by-layer add_param_group), each segment's in backward order.

    Args:
        stores: the gradient stores, one per segment; each has `.buckets` and `.launch(k)`.
        queue: the ReductionQueue the stores launch into.
    """

    def __init__(self, stores: list, queue: ReductionQueue):
        self.queue = queue
        self.order = [(store, k) for store in reversed(stores) for k in range(len(store.buckets))]
        self._place = {(id(store), k): i for i, (store, k) in enumerate(self.order)}
        self._arrived = [0] * len(self.order)
        self._launched = 0

    def arrive(self, store, bucket: int) -> None:
        """One gradient of `bucket` is complete; launch every bucket that is now due, in order."""
        self._arrived[self._place[id(store), bucket]] += 1
        while self._launched < len(self.order):
            store, k = self.order[self._launched]
            if self._arrived[self._launched] < len(store.buckets[k].indices):
                break
            store.launch(k)
            self._launched += 1

    def flush(self) -> None:
        """Launch every bucket not launched yet (their missing gradients count as zeros), then wait for all."""
        while self._launched < len(self.order):
            store, k = self.order[self._launched]
            store.launch(k)
            self._launched += 1
        self.queue.wait_all()
        self._arrived = [0] * len(self.order)
        self._launched = 0
