"""The partition arithmetic of Zero1Optimizer (pure functions: no processes)."""

from __future__ import annotations

import itertools

import pytest

from zero_train.sharding.partition import balance_report, flat_layout, greedy_owners


def test_greedy_owners_largest_first_to_least_loaded():
    # largest first: 10 -> r0 (10), 7 -> r1 (7), 5 -> r1 (12), 3 -> r0 (13), 1 -> r1 (13)
    assert greedy_owners([3, 10, 5, 7, 1], 2) == [0, 0, 1, 1, 1]
    assert greedy_owners([4, 4, 4], 3) == [0, 1, 2]  # ties go to the lowest rank
    assert greedy_owners([5, 5], 1) == [0, 0]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_greedy_is_within_one_tensor_of_perfect(world_size):
    numels = [(i * 37) % 101 + 1 for i in range(40)]
    owners = greedy_owners(numels, world_size)
    loads = [sum(n for n, o in zip(numels, owners, strict=True) if o == r) for r in range(world_size)]
    assert sum(loads) == sum(numels)
    assert max(loads) - sum(numels) / world_size <= max(numels)


def test_fewer_tensors_than_ranks_leaves_ranks_empty():
    owners = greedy_owners([6, 2], 4)
    layout = flat_layout([6, 2], owners, 4)
    assert owners == [0, 1]
    assert layout.loads() == [6, 2, 0, 0]
    assert layout.owned(2) == [] and layout.owned(3) == []
    assert layout.region_size == 6 and layout.total_size == 24 and layout.padding() == 16


def test_start_loads_balance_a_group_added_later():
    assert greedy_owners([4, 1], 2, start_loads=[10, 0]) == [1, 1]


def test_flat_layout_regions_are_contiguous_and_disjoint():
    numels = [3, 10, 5, 7, 1]
    owners = greedy_owners(numels, 2)
    layout = flat_layout(numels, owners, 2)
    assert layout.region_size == 13 and layout.total_size == 26
    covered = set()
    for index, (offset, numel) in enumerate(zip(layout.offsets, numels, strict=True)):
        start, stop = layout.region(owners[index])
        assert start <= offset and offset + numel <= stop  # a tensor lies inside its owner's region
        span = set(range(offset, offset + numel))
        assert not span & covered
        covered |= span
    assert len(covered) == sum(numels)
    # rank 0 owns t0, t1 in index order (t0 at 0, t1 at 3); rank 1 owns t2, t3, t4 from 13 on
    assert [layout.offsets[i] for i in layout.owned(0)] == [0, 3]
    assert [layout.offsets[i] for i in layout.owned(1)] == [13, 18, 25]


def test_every_element_owned_once_for_many_shapes():
    for world_size, count in itertools.product([1, 2, 3, 5], [1, 2, 9]):
        numels = [(7 * i) % 13 + 1 for i in range(count)]
        layout = flat_layout(numels, greedy_owners(numels, world_size), world_size)
        assert sum(layout.loads()) == sum(numels)
        assert layout.total_size == world_size * max(layout.loads())


def test_balance_report_bytes_and_padding():
    numels = [3, 10, 5, 7, 1]
    layout = flat_layout(numels, greedy_owners(numels, 2), 2)
    report = balance_report(layout, element_size=4)
    assert report["bytes_per_rank"] == [52, 52]
    assert report["max_bytes"] == report["min_bytes"] == 52
    assert report["max_over_mean"] == 1.0
    assert report["padding_bytes"] == 0
    assert report["tensors_per_rank"] == [2, 3]
    skewed = balance_report(flat_layout([8, 2], [0, 1], 2), element_size=2)
    assert skewed["padding_bytes"] == 12 and skewed["max_over_mean"] == 8 / 5
