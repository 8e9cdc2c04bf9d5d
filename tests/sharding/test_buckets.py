"""comm/buckets.py: which gradients travel together (buckets of whole tensors) and the one order every rank
launches them in; accounting.py's default bucket size. No processes: hand-computed layouts."""

from __future__ import annotations

import pytest

from zero_train.sharding.accounting import MIN_BUCKETS, default_bucket_elements
from zero_train.sharding.comm.buckets import BucketSchedule, bucket_groups, gradient_buckets
from zero_train.sharding.partition import flat_partition

pytestmark = pytest.mark.tier("quick")


def test_buckets_run_backwards_over_whole_trainable_tensors_and_give_each_rank_its_part():
    partition = flat_partition([3, 10, 5, 7, 1], 3)
    buckets = gradient_buckets(partition, 12)
    # from the end: [7, 1] (8), then 5 would make 13 > 12 -> [5], then 10 -> [10], then 3
    assert [b.indices for b in buckets] == [(3, 4), (2,), (1,), (0,)]
    assert [(b.start, b.stop) for b in buckets] == [(18, 26), (13, 18), (3, 13), (0, 3)]
    assert buckets[2].lengths == (6, 4, 0) and buckets[2].starts == (0, 6, 0)  # t1 spans ranks 0 and 1
    assert not any(b.direct for b in buckets)
    assert [b.direct for b in gradient_buckets(partition, 10)] == [False, False, True, False]
    frozen = gradient_buckets(partition, 100, active=[True, True, False, True, True])
    assert [b.indices for b in frozen] == [
        (3, 4),
        (0, 1),
    ]  # a frozen tensor travels in none and ends a bucket
    for bucket in buckets:  # rank parts are the bucket's overlap with each slice
        for rank in range(3):
            low, high = partition.rank_range(rank)
            expected = max(0, min(high, bucket.stop) - max(low, bucket.start))
            assert bucket.lengths[rank] == expected


class _Store:
    """A gradient store as BucketSchedule sees one: its buckets, and the launches it was asked for."""

    def __init__(self, name, partition, bucket_elements, launched, active=None):
        self.name, self.launched = name, launched
        self.buckets = gradient_buckets(partition, bucket_elements, active)

    def launch(self, k):
        self.launched.append((self.name, k))


class _Queue:
    waits = 0

    def wait_all(self):
        self.waits += 1


def test_the_schedule_launches_newest_segment_first_in_bucket_order_whatever_order_gradients_arrive():
    launched, queue = [], _Queue()
    frozen_2 = [True, True, False, True, True]
    old = _Store("old", flat_partition([3, 10, 5, 7, 1], 2), 12, launched, frozen_2)  # (3, 4) (1,) (0,)
    new = _Store("new", flat_partition([4, 4], 2), 100, launched)  # one bucket: (0, 1)
    schedule = BucketSchedule([old, new], queue)
    assert [(s.name, k) for s, k in schedule.order] == [("new", 0), ("old", 0), ("old", 1), ("old", 2)]
    schedule.arrive(old, 1)  # old's second bucket complete: it waits for every bucket before it
    schedule.arrive(old, 2)  # frozen: in no bucket
    schedule.arrive(new, 0)
    schedule.arrive(old, 4)
    schedule.arrive(old, 3)
    assert launched == []  # new's bucket holds two tensors, one arrived
    schedule.arrive(new, 1)  # new complete: it, then old's (3, 4) and (1,), in order
    assert launched == [("new", 0), ("old", 0), ("old", 1)]
    schedule.flush()  # the rest, though incomplete (a missing gradient counts as zeros), then one wait
    assert launched[3:] == [("old", 2)] and queue.waits == 1
    schedule.flush()  # the next step starts from the first bucket again
    assert launched[4:] == [("new", 0), ("old", 0), ("old", 1), ("old", 2)] and queue.waits == 2


@pytest.mark.parametrize(
    "numels",
    [
        [
            38_597_376,
            786_432,
            *[2_362_368, 768, 589_824, 768, 768, 768, 2_359_296, 3_072] * 12,
        ],  # GPT-2 small
        [1_608_224, 32, 32, 3_072, 96, 1_024, 32, 32, 32, 4_096, 128, 4_096, 32],  # its 50k vocabulary: 97%
        [10, 10, 10, 10],
    ],
)
def test_the_default_bucket_cuts_any_model_in_at_least_four(numels):
    size = default_bucket_elements(numels, 500_000_000)
    assert len(bucket_groups(numels, size)) >= MIN_BUCKETS
    assert size <= -(-sum(numels) // MIN_BUCKETS)
    assert default_bucket_elements(numels, 1_000) <= 1_000  # DeepSpeed's cap (5e8) bounds it for huge models
