"""CommLedger counts exactly the payload of known collectives; DDP per-step bytes match 2 Psi arithmetic."""

import pytest
import torch
import torch.distributed as dist

from zero_train.comm.ledger import CommLedger, paper_volume_bytes, wire_factor, wire_from_payload

pytestmark = pytest.mark.tier("multiproc")


def _collectives(rank, world_size):
    with CommLedger() as ledger:
        dist.all_reduce(torch.ones(10))  # 40 B
        out = torch.empty(2 * 6)
        dist.all_gather_into_tensor(out, torch.ones(6))  # output 48 B
        shard = torch.empty(3)
        dist.reduce_scatter_tensor(shard, torch.ones(6))  # input 24 B
        dist.broadcast(torch.ones(5, dtype=torch.float64), src=0)  # 40 B
    dist.all_reduce(torch.ones(100))  # outside the ledger: not counted
    return ledger.totals(), ledger.wire_bytes()


def _ddp_step(rank, world_size):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    with CommLedger() as ledger:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ledger.reset()  # DDP broadcasts its parameters at construction
        ddp(torch.randn(3, 8)).sum().backward()
    num_params = sum(p.numel() for p in model.parameters())
    return ledger.totals(), num_params


def test_ledger_counts_payload_of_known_collectives(rank_pool):
    for totals, wire in rank_pool(2).run(_collectives):
        assert totals["all_reduce"] == 40
        assert totals["all_gather"] == 48
        assert totals["reduce_scatter"] == 24
        assert totals["broadcast"] == 40
        assert totals["total"] == 152
        assert wire["all_reduce"] == 40  # 2(N-1)/N = 1 at N = 2
        assert wire["all_gather"] == 24


def test_ddp_step_moves_psi_payload_and_2psi_paper_volume(rank_pool):
    for totals, num_params in rank_pool(2).run(_ddp_step):
        assert totals["all_reduce"] == num_params * 4
        # an all-reduce is a reduce-scatter plus an all-gather: 2 Psi in the paper's accounting
        assert 2 * totals["all_reduce"] == paper_volume_bytes(0, num_params, 4)


@pytest.mark.tier("quick")
def test_wire_factors():
    assert wire_factor("all_reduce", 4) == 1.5
    assert wire_factor("all_gather", 4) == 0.75
    assert wire_factor("all_reduce", 1) == 0.0


def _ring_exchange(rank, world_size):
    other = 1 - rank
    with CommLedger() as ledger:
        received = dist.irecv(torch.empty(8), src=other)  # 32 B in
        dist.isend(torch.ones(8), dst=other).wait()  # 32 B out
        received.wait()
    return ledger.totals(), ledger.wire_bytes()


def test_point_to_point_payload_counts_both_ends_wire_only_the_send(rank_pool):
    for totals, wire in rank_pool(2).run(_ring_exchange):
        assert totals["send_recv"] == 64
        assert wire["send_recv"] == 32
        assert wire_from_payload(totals, 2)["send_recv"] == 32


@pytest.mark.tier("quick")
def test_gloo_reduce_scatter_is_sent_as_an_all_reduce():
    assert wire_factor("reduce_scatter", 4) == 0.75
    assert wire_factor("reduce_scatter", 4, "gloo") == wire_factor("all_reduce", 4) == 1.5
    payload = dict(all_reduce=100, reduce_scatter=100, all_gather=100, broadcast=100)
    assert wire_from_payload(payload, 2, "gloo") == dict(
        all_reduce=100, reduce_scatter=100, all_gather=50, broadcast=50, reduce=0, send_recv=0, total=300
    )
