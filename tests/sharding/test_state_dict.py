"""Our sharders' state dicts (ZeRO-1 and ZeRO-2): shard round trip, consolidation, re-sharding 2 -> 3 and
2 -> 1, memory per rank. Both sharders run in the same spawned worlds, each on its own files.

One run at world size 2 trains 3 steps, saves every rank's shard, the consolidated dict and the
weights, trains 3 more steps, and checks that a fresh optimizer loaded from its own shard continues
bit for bit. Then world size 3 (spawned) and world size 1 (in this process) load the merged shards and
continue; their reference is the PLAIN inner optimizer loaded with the consolidated dict, stepping on
the same averaged gradients: equal bit for bit.
"""

from __future__ import annotations

import os
from functools import partial

import pytest
import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import Zero1Optimizer, Zero2Optimizer, consolidate_shards
from zero_train.sharding.zero12 import report as zero12_report
from zero_train.sharding.zero12 import state as zero12_state
from zero_train.testing.sharders import TiedNet, batch, piece_average, two_groups

pytestmark = pytest.mark.tier("multiproc")

LR = 3e-2
SAVED_AT, CONTINUE = 3, range(3, 6)
STAGES = (1, 2)


def _make(dtype: torch.dtype, seed: int = 0, stage: int = 1) -> tuple[TiedNet, Zero1Optimizer]:
    model = TiedNet(seed).to(dtype)
    sharder = Zero1Optimizer if stage == 1 else partial(Zero2Optimizer, bucket_elements=100)
    return model, sharder(two_groups(model, LR), torch.optim.AdamW, lr=LR, weight_decay=0.1, foreach=False)


def _train(model: TiedNet, optimizer: Zero1Optimizer, rank: int, steps) -> None:
    for step in steps:
        model(batch(rank, step, 0)).backward()
        optimizer.reduce_gradients()
        optimizer.step()
        optimizer.zero_grad()


def _max_diff(a: TiedNet, b: TiedNet) -> float:
    return max(
        float((x.detach().float() - y.detach().float()).abs().max())
        for x, y in zip(a.parameters(), b.parameters(), strict=True)
    )


def _state_bytes(state: dict) -> list[int]:
    return [
        sum(v.numel() * v.element_size() for v in s.values() if isinstance(v, torch.Tensor))
        for s in state.values()
    ]


def _pieces(model: TiedNet, optimizer) -> list[list[tuple[int, int, int]]]:
    return [zero12_report.pieces_of(optimizer, p) for p in model.parameters() if p.requires_grad]


def _plain_continue(weights: dict, consolidated: dict, world_size: int, pieces: list) -> TiedNet:
    """The unsharded reference: plain AdamW loaded with the consolidated state, ring-averaged gradients."""
    reference = TiedNet(seed=5)
    reference.load_state_dict(weights)
    plain = torch.optim.AdamW(two_groups(reference, LR), lr=LR, weight_decay=0.1, foreach=False)
    plain.load_state_dict(consolidated)
    trainable = [p for p in reference.parameters() if p.requires_grad]
    for step in CONTINUE:
        grads_by_rank = []
        for rank in range(world_size):
            reference.zero_grad()
            reference(batch(rank, step, 0)).backward()
            grads_by_rank.append([p.grad.clone() for p in trainable])
        for i, param in enumerate(trainable):
            param.grad = piece_average([[g[i]] for g in grads_by_rank], pieces[i], stage=1)
        plain.step()
    return reference


def _save_and_round_trip(rank: int, world_size: int, tmp: str) -> dict:
    return {stage: _save_and_round_trip_stage(rank, world_size, f"{tmp}/z{stage}", stage) for stage in STAGES}


def _save_and_round_trip_stage(rank: int, world_size: int, tmp: str, stage: int) -> dict:
    results = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model, optimizer = _make(dtype, stage=stage)
        _train(model, optimizer, rank, range(SAVED_AT))
        torch.save(zero12_state.state_dict(optimizer), f"{tmp}/{name}-shard{rank}.pt")
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        # collective: all shards are saved after it
        consolidated = zero12_state.consolidated_state_dict(optimizer, to=0)
        if rank == 0:
            torch.save(weights, f"{tmp}/{name}-weights.pt")
            torch.save(consolidated, f"{tmp}/{name}-consolidated.pt")
        results[f"{name}_memory"] = zero12_report.memory_bytes(optimizer)
        results[f"{name}_slice"] = zero12_report.partitions(optimizer)[0].partition_size
        results[f"{name}_pieces"] = [
            len(zero12_report.partitions(optimizer)[0].pieces(r)) for r in range(world_size)
        ]
        results[f"{name}_loads"] = zero12_report.partitions(optimizer)[0].loads()
        _train(model, optimizer, rank, CONTINUE)

        fresh_model, fresh = _make(dtype, seed=1, stage=stage)
        fresh_model.load_state_dict(weights)
        zero12_state.load_state_dict(fresh, torch.load(f"{tmp}/{name}-shard{rank}.pt"))
        _train(fresh_model, fresh, rank, CONTINUE)
        results[f"{name}_round_trip_diff"] = _max_diff(model, fresh_model)
        masters = zip(
            zero12_state.full_master_params(optimizer), zero12_state.full_master_params(fresh), strict=True
        )
        results[f"{name}_master_diff"] = max(float((a - b).abs().max()) for a, b in masters)
        if name == "fp32" and rank == 0:
            reference = _plain_continue(weights, consolidated, world_size, _pieces(model, optimizer))
            results["plain_diff"] = _max_diff(model, reference)
            results["unsharded_state_bytes"] = _state_bytes(consolidated["state"])
    try:
        zero12_state.load_state_dict(fresh, torch.load(f"{tmp}/bf16-shard{1 - rank}.pt"))
    except UsageError as error:
        results["wrong_shard_error"] = str(error)
    return results


def _reshard(rank: int, world_size: int, tmp: str) -> dict:
    return {stage: _reshard_stage(rank, world_size, f"{tmp}/z{stage}", stage) for stage in STAGES}


def _reshard_stage(rank: int, world_size: int, tmp: str, stage: int) -> dict:
    shards = [torch.load(f"{tmp}/fp32-shard{r}.pt") for r in range(2)]
    weights = torch.load(f"{tmp}/fp32-weights.pt")
    model, optimizer = _make(torch.float32, seed=1, stage=stage)
    model.load_state_dict(weights)
    try:
        zero12_state.load_state_dict(optimizer, shards[0])
        shard_error = None
    except UsageError as error:
        shard_error = str(error)
    zero12_state.load_state_dict(optimizer, consolidate_shards(shards))
    memory = zero12_report.memory_bytes(optimizer)
    _train(model, optimizer, rank, CONTINUE)
    reference = _plain_continue(
        weights, torch.load(f"{tmp}/fp32-consolidated.pt"), world_size, _pieces(model, optimizer)
    )
    pieces = len(zero12_report.partitions(optimizer)[0].pieces(rank))
    return dict(diff=_max_diff(model, reference), shard_error=shard_error, memory=memory, pieces=pieces)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, rank_pool):
    tmp = str(tmp_path_factory.mktemp("zero1_state"))
    for stage in STAGES:
        os.makedirs(f"{tmp}/z{stage}")
    return tmp, rank_pool(2).run(_save_and_round_trip, (tmp,))


@pytest.mark.parametrize("stage", STAGES, ids=["zero1", "zero2"])
def test_shard_round_trip_continues_bit_for_bit(saved, stage):
    for results in saved[1]:
        for name in ("fp32", "bf16"):
            assert results[stage][f"{name}_round_trip_diff"] == 0.0
            assert results[stage][f"{name}_master_diff"] == 0.0  # bf16: the fp32 masters travel in the shard


@pytest.mark.parametrize("stage", STAGES, ids=["zero1", "zero2"])
def test_consolidated_state_loads_into_plain_adamw_and_continues_identically(saved, stage):
    assert saved[1][0][stage]["plain_diff"] == 0.0


@pytest.mark.parametrize("stage", STAGES, ids=["zero1", "zero2"])
def test_loading_another_ranks_shard_names_the_fix(saved, stage):
    for results in saved[1]:
        assert "consolidate_shards" in results[stage]["wrong_shard_error"]


@pytest.mark.parametrize("stage", STAGES, ids=["zero1", "zero2"])
def test_optimizer_state_is_split_across_ranks(saved, stage):
    per_param = saved[1][0][stage]["unsharded_state_bytes"]
    total, step_bytes = sum(per_param), 4  # AdamW: exp_avg, exp_avg_sq per element, a float32 step per tensor
    for name in ("fp32", "bf16"):
        results = [r[stage] for r in saved[1]]
        states = [r[f"{name}_memory"]["optimizer_states"] for r in results]
        pieces, loads = results[0][f"{name}_pieces"], results[0][f"{name}_loads"]
        assert sum(pieces) > len(per_param)  # some tensor is split between the two ranks
        # every element's state exists exactly once; a split tensor has a step counter on each of its owners
        assert sum(states) == total + step_bytes * (sum(pieces) - len(per_param))
        for rank, state in enumerate(states):  # each rank holds the state of exactly its slice
            assert state == 8 * loads[rank] + step_bytes * pieces[rank]
        assert max(loads) - min(loads) < 2  # equal slices (the padding, fewer than N elements, aside)
    for results in saved[1]:
        bf16 = results[stage]["bf16_memory"]
        assert bf16["master_params"] == 4 * results[stage]["bf16_slice"]  # fp32 masters of this rank's slice
        assert results[stage]["fp32_memory"]["master_params"] == 0


def test_reshard_to_three_ranks_continues_identically(saved, rank_pool):
    tmp = saved[0]
    runs = rank_pool(3).run(_reshard, (tmp,))
    for stage in STAGES:
        assert runs[0][stage]["diff"] == 0.0
        assert all("rank 0 of 2" in run[stage]["shard_error"] for run in runs[1:])
        per_param = saved[1][0][stage]["unsharded_state_bytes"]
        split = sum(run[stage]["pieces"] for run in runs) - len(per_param)  # a step counter per extra piece
        assert split >= 1
        assert sum(run[stage]["memory"]["optimizer_states"] for run in runs) == sum(per_param) + 4 * split


def test_reshard_to_one_rank_continues_identically(saved):
    for stage, result in _reshard(0, 1, saved[0]).items():
        assert result["diff"] == 0.0
        assert "rank 0 of 2" in result["shard_error"]
        assert result["memory"]["optimizer_states"] == sum(saved[1][0][stage]["unsharded_state_bytes"])


def test_shards_of_the_whole_tensor_layout_load_through_consolidation(saved, tmp_path):
    """A checkpoint written before the partitions split tensors held, per rank, the whole state of the tensors
    that rank owned (format zero_train.zero1_shard/1). Made here by cutting the saved state by tensor: one such
    shard alone is refused in one line naming the layout; the checkpoint loader merges them (at the same world
    size too) and training continues exactly like the plain optimizer from the same state."""
    from zero_train.checkpoint.elastic import load_sharded_optimizer

    consolidated = torch.load(f"{saved[0]}/z1/fp32-consolidated.pt")
    weights = torch.load(f"{saved[0]}/z1/fp32-weights.pt")
    old = [
        dict(
            format="zero_train.zero1_shard/1",
            world_size=2,
            rank=rank,
            param_groups=consolidated["param_groups"],
            state={i: s for i, s in consolidated["state"].items() if i % 2 == rank},
            master_params={},
            loss_scaler=None,
        )  # fmt: skip
        for rank in range(2)
    ]
    model, optimizer = _make(torch.float32, seed=1)
    with pytest.raises(UsageError, match=r"whole-tensor layout \(zero_train.zero1_shard/1\)") as refused:
        zero12_state.load_state_dict(optimizer, old[0])
    assert "\n" not in str(refused.value) and "consolidate_shards" in str(refused.value)
    (tmp_path / "optim").mkdir()
    for rank, shard in enumerate(old):
        payload = dict(client_state={"rank": rank}, counters={}, world_size=2, optimizer=shard)
        torch.save(payload, tmp_path / "optim" / f"rank-{rank:05d}.pt")
    own, state = load_sharded_optimizer(tmp_path, rank=1, world_size=2)
    assert own["client_state"] == {"rank": 1}
    assert sorted(state["state"]) == sorted(consolidated["state"])
    for index, expected in consolidated["state"].items():
        assert all(
            torch.equal(torch.as_tensor(state["state"][index][k]), torch.as_tensor(v))
            for k, v in expected.items()
        )
    model.load_state_dict(weights)
    zero12_state.load_state_dict(optimizer, state)
    _train(model, optimizer, 0, CONTINUE)
    reference = _plain_continue(weights, consolidated, 1, _pieces(model, optimizer))
    assert _max_diff(model, reference) == 0.0
