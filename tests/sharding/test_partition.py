"""The sharders' pure arithmetic: partitions, the gloo ring's schedule, split-invariant norms (buckets: test_buckets.py).

No processes: everything here runs in this one, against hand-computed layouts and torch's own optimizers.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from zero_train.hf.models import model_config
from zero_train.sharding import norms
from zero_train.sharding.accounting import balance_report, padding
from zero_train.sharding.comm.gloo import ring_receive_elements, ring_schedule
from zero_train.sharding.partition import Piece, flat_partition
from zero_train.sharding.state_dict import pieces_of
from zero_train.sharding.step import ELEMENTWISE_OPTIMIZERS

pytestmark = pytest.mark.tier("quick")


def test_partition_cuts_one_flat_buffer_into_equal_slices_and_splits_tensors():
    partition = flat_partition([3, 10, 5, 7, 1], 3)  # 26 elements -> slices of 9, one padding element
    assert partition.offsets == (0, 3, 13, 18, 25)
    assert partition.partition_size == 9 and partition.total_size == 27 and padding(partition) == 1
    assert [partition.rank_range(r) for r in range(3)] == [(0, 9), (9, 18), (18, 27)]
    assert partition.loads() == [9, 9, 8]
    assert partition.pieces(0) == (Piece(0, 0, 3, 0, whole=True), Piece(1, 0, 6, 3, whole=False))
    assert partition.pieces(1) == (Piece(1, 6, 4, 9, whole=False), Piece(2, 0, 5, 13, whole=True))
    assert partition.pieces(2) == (Piece(3, 0, 7, 18, whole=True), Piece(4, 0, 1, 25, whole=True))
    assert [(rank, p.tensor_offset, p.length) for rank, p in pieces_of(partition, 1)] == [
        (0, 0, 6),
        (1, 6, 4),
    ]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7, 8, 64])
def test_every_element_is_owned_exactly_once_and_padding_is_below_n(world_size):
    for count in (1, 2, 9, 40):
        numels = [(37 * i) % 101 + 1 for i in range(count)]
        partition = flat_partition(numels, world_size)
        owned = [0] * partition.total_size
        for rank in range(world_size):
            start, stop = partition.rank_range(rank)
            for piece in partition.pieces(rank):
                assert start <= piece.flat_offset and piece.flat_offset + piece.length <= stop
                assert piece.flat_offset == partition.offsets[piece.index] + piece.tensor_offset
                for element in range(piece.flat_offset, piece.flat_offset + piece.length):
                    owned[element] += 1
        assert owned == [1] * sum(numels) + [0] * padding(partition)
        assert padding(partition) < world_size or sum(numels) < world_size
        assert max(partition.loads()) - min(partition.loads()) <= max(padding(partition), 1)
        for index, numel in enumerate(numels):  # pieces_of joins back into the tensor, in order
            spans = [(p.tensor_offset, p.length) for _, p in pieces_of(partition, index)]
            assert sum(length for _, length in spans) == numel and spans[0][0] == 0
            assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_a_piece_copied_by_its_slices_rebuilds_every_tensor_from_the_rank_slices():
    """Piece.within (and the piece's tensor_offset/length) are the one slice arithmetic ZeRO-1/2's segments and ZeRO-3's units use:
    scattering whole tensors into rank slices with them and reading the slices back gives the tensors."""
    numels = [3, 10, 5, 7, 1]
    tensors = [torch.arange(n, dtype=torch.float32) + 100 * i for i, n in enumerate(numels)]
    partition = flat_partition(numels, 3)
    slices = [torch.full((partition.partition_size,), -1.0) for _ in range(partition.world_size)]
    for rank in range(partition.world_size):
        start = partition.rank_range(rank)[0]
        for piece in partition.pieces(rank):
            slices[rank][piece.within(start)] = tensors[piece.index][
                piece.tensor_offset : piece.tensor_offset + piece.length
            ]
    flat = torch.cat(slices)
    for index, tensor in enumerate(tensors):
        offset = partition.offsets[index]
        assert torch.equal(flat[offset : offset + numels[index]], tensor)
    assert flat[-padding(partition) :].tolist() == [-1.0]  # the padding was never written


def test_gpt2_small_holds_psi_over_n_at_every_world_size():
    """The whole-tensor layout held 1.00 / 1.24 / 2.48 / 4.96 / 19.85 Psi per rank at 2 / 4 / 8 / 16 / 64 ranks
    on these shapes (the 38.6M-element embedding set every region); a flat partition holds Psi / N."""
    from transformers import GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(model_config("gpt2-small", vocab_size=50257))
    numels = [p.numel() for p in model.parameters()]
    psi = sum(numels)
    for world_size in (2, 4, 8, 16, 64):
        partition = flat_partition(numels, world_size)
        assert padding(partition) < world_size
        assert max(partition.loads()) == -(-psi // world_size)
        report = balance_report(partition, 4)
        assert report["max_over_mean"] < 1 + world_size / psi


def test_balance_report_bytes_and_padding():
    report = balance_report(flat_partition([3, 10, 5, 7, 1], 3), element_size=4)
    assert report["bytes_per_rank"] == [36, 36, 32] and report["padding_bytes"] == 4
    assert report["pieces_per_rank"] == [2, 2, 2]
    assert report["max_over_mean"] == pytest.approx(36 / (104 / 3))


def _simulate_ring(starts, lengths, chunk, world_size):
    """Run ring_schedule's messages between N simulated ranks; each element holds the list of who added it."""
    data = [
        {e: [rank] for s, n in zip(starts, lengths, strict=True) for e in range(s, s + n)}
        for rank in range(world_size)
    ]
    schedules = [ring_schedule(starts, lengths, rank, chunk) for rank in range(world_size)]
    assert len({len(s) for s in schedules}) == 1
    for step in range(len(schedules[0])):
        sends = [schedules[rank][step][0] for rank in range(world_size)]
        messages = [
            [[list(data[rank][e]) for e in range(s, s + n)] for s, n in sends[rank]]
            for rank in range(world_size)
        ]
        for rank in range(world_size):
            left = (rank - 1) % world_size
            # what the left neighbour sends is what this one expects, in order
            assert sends[left] == schedules[rank][step][1]
            for (start, _), values in zip(sends[left], messages[left], strict=True):
                for offset, value in enumerate(values):
                    data[rank][start + offset] = value + data[rank][start + offset]
    return data


@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
def test_ring_sums_every_part_on_its_owner_in_ring_order_whatever_the_chunks(world_size):
    """Equal parts, one part holding everything (a bucket inside one slice), every other part empty."""
    for lengths in ([5] * world_size, [0] * (world_size - 1) + [13], ([7, 0] * world_size)[:world_size]):
        starts = list(itertools.accumulate([0, *lengths]))[:-1]
        for chunk in (1, 2, 3, 100):
            data = _simulate_ring(starts, lengths, chunk, world_size)
            for owner in range(world_size):
                order = [(owner + k) % world_size for k in range(1, world_size + 1)]  # r+1, r+2, ..., r
                for element in range(starts[owner], starts[owner] + lengths[owner]):
                    assert data[owner][element] == order  # who added, in order
    assert ring_receive_elements([4, 4]) == 4  # a small bucket travels whole: one part per step
    assert ring_receive_elements([100, 0, 0], limit=8) == 8  # one part: one chunk per step, at most the limit
    assert ring_receive_elements([9, 9, 9], limit=8) == 2 * 4  # two parts send to each rank: two chunks of 4


# every accepted optimizer with its defaults, then the options our engines and users turn on
SPLIT_CASES = [(cls, {}) for cls in ELEMENTWISE_OPTIMIZERS] + [
    (torch.optim.AdamW, dict(weight_decay=0.1)),
    (torch.optim.Adam, dict(amsgrad=True, weight_decay=0.1)),
    (torch.optim.SGD, dict(momentum=0.9, nesterov=True, weight_decay=0.01)),
]


@pytest.mark.parametrize(("optimizer", "options"), SPLIT_CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_split_tensor_updates_bit_for_bit_as_the_whole_one(optimizer, options):
    """What makes element-balanced sharding exact, and why the sharders accept only these optimizers: each
    (single-tensor and foreach) updates two pieces of a tensor exactly as the tensor."""
    generator = torch.Generator().manual_seed(0)
    for foreach, numel in itertools.product((False, True), (17, 1000, 4099)):
        cut = numel // 3
        weights = torch.randn(numel, generator=generator)
        whole = weights.clone().requires_grad_()
        first, rest = weights[:cut].clone().requires_grad_(), weights[cut:].clone().requires_grad_()
        one = optimizer([whole], lr=1e-2, foreach=foreach, **options)
        two = optimizer([first, rest], lr=1e-2, foreach=foreach, **options)
        for _ in range(4):
            grad = torch.randn(numel, generator=generator)
            whole.grad, first.grad, rest.grad = grad.clone(), grad[:cut].clone(), grad[cut:].clone()
            one.step()
            two.step()
        assert torch.equal(whole.detach(), torch.cat([first.detach(), rest.detach()]))


def test_norm_from_pieces_is_the_norm_from_whole_tensors():
    """The float64 partial sums make the float32 norm independent of where the tensors are cut (float32
    partial norms agree with the whole tensor's norm for only 17% of random cuts)."""
    generator = torch.Generator().manual_seed(1)
    agree = 0
    for _ in range(300):
        tensors = [
            torch.randn(int(n), generator=generator) * 3
            for n in torch.randint(1, 3000, (4,), generator=generator)
        ]
        flat = torch.cat(tensors)
        cuts = sorted(torch.randint(1, flat.numel(), (3,), generator=generator).tolist())
        pieces = [flat[a:b] for a, b in zip([0, *cuts], [*cuts, flat.numel()], strict=True)]
        split = norms.total_norm(sum(norms.sum_of_powers([p]) for p in pieces))
        agree += bool(split == norms.total_norm(norms.sum_of_powers(tensors)))
        assert float(split) == pytest.approx(float(torch.linalg.vector_norm(flat.double())), rel=1e-7)
    assert agree == 300
