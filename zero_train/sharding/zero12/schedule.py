"""BucketSchedule: every segment's buckets reduced in one order on every rank, as soon as they are complete.

ZeRO-1 (in its boundary backward) and ZeRO-2 (in every backward) launch each bucket's reduction into the
ReductionQueue (comm/overlap.py) from the gradient hooks; this is the order they launch in.
"""

from __future__ import annotations

from zero_train.sharding.comm.overlap import ReductionQueue


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
