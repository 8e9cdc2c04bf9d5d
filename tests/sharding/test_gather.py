"""Export and consolidation gather to one rank through CPU, one tensor at a time (zero_train.sharding.comm.gather).

One 2-rank gloo run: a bf16 model of 24 equal linear layers under Zero1Optimizer, 2 AdamW steps, then
- gathered_master_params(to=0) and (to=1) equal the all-gathered masters, in CPU memory, only on the receiver;
- consolidated_state_dict equals consolidate_shards of the ranks' own state dicts, every tensor on CPU;
- the peak of a sending rank (mallinfo2 with a 1 ms sampler, zero_train.memory.measure) grows by at most
  two tensors while its receiver gets the whole fp32 model, where the all-gather grows EVERY rank by the
  whole model (the reference that shows the measurement can see it); consolidating grows the sender by
  its own state_dict() (a copy of its master shard) only, not by the other ranks' shards.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from zero_train.sharding.zero12 import report as zero12_report
from zero_train.sharding.zero12 import state as zero12_state
from zero_train.testing import run_ranks

pytestmark = pytest.mark.tier("multiproc")

LAYERS, WIDTH = 24, 256  # 24 x 256 KiB fp32 masters = 6 MiB: large against malloc noise, small to run


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)]
    return torch.nn.Sequential(*layers).to(torch.bfloat16)


def _growth(fn) -> tuple[object, int]:
    """(fn(), peak allocator bytes during fn minus the level before it) on this process."""
    from zero_train.memory import measure

    tracker = measure.cpu_peak_tracker()
    dist.barrier()
    tracker.reset()
    before = tracker.sample()
    result = fn()
    return result, tracker.peak() - before


def _gather_run(rank: int, world_size: int) -> dict:
    from zero_train.sharding import Zero1Optimizer, consolidate_shards

    model = _model()
    optimizer = Zero1Optimizer(list(model.parameters()), torch.optim.AdamW, lr=1e-2)
    for step in range(2):
        torch.manual_seed(10 * step + rank)
        model(torch.randn(4, WIDTH, dtype=torch.bfloat16)).float().pow(2).mean().backward()
        optimizer.reduce_gradients()
        optimizer.step()
        optimizer.zero_grad()
    out: dict = {}
    reference = [m.clone() for m in zero12_state.full_master_params(optimizer)]
    for to in (0, 1):
        gathered, out[f"gathered_growth_to{to}"] = _growth(
            lambda to=to: zero12_state.gathered_master_params(optimizer, to=to)
        )
        out[f"is_none_to{to}"] = gathered is None
        if gathered is not None:
            out[f"master_diff_to{to}"] = max(
                float((a - b).abs().max()) for a, b in zip(gathered, reference, strict=True)
            )
            out[f"devices_to{to}"] = sorted({str(t.device) for t in gathered})
        del gathered
    full, out["all_gather_growth"] = _growth(lambda: zero12_state.full_master_params(optimizer))
    del full
    shards = [None] * world_size
    dist.all_gather_object(shards, zero12_state.state_dict(optimizer))  # the reference: every shard, by rank
    consolidated, out["consolidate_growth"] = _growth(
        lambda: zero12_state.consolidated_state_dict(optimizer, to=0)
    )
    if consolidated is not None:
        expected = consolidate_shards(shards)
        out["state_keys_equal"] = expected["state"].keys() == consolidated["state"].keys()
        out["state_diff"] = max(
            float((consolidated["state"][i][name] - value).abs().max())
            for i, state in expected["state"].items()
            for name, value in state.items()
        )
        out["master_state_diff"] = max(
            float((consolidated["master_params"][i] - value).abs().max())
            for i, value in expected["master_params"].items()
        )
        out["state_devices"] = sorted(
            {str(v.device) for s in consolidated["state"].values() for v in s.values()}
            | {str(v.device) for v in consolidated["master_params"].values()}
        )
    out["consolidated_is_none"] = consolidated is None
    out["own_master_bytes"] = zero12_report.memory_bytes(optimizer)["master_params"]
    return out


def test_gather_to_one_rank_through_cpu_keeps_senders_flat():
    model_bytes = LAYERS * WIDTH * WIDTH * 4
    tensor_bytes = WIDTH * WIDTH * 4
    ranks = run_ranks(_gather_run, world_size=2)
    for rank, result in enumerate(ranks):
        for to in (0, 1):
            assert result[f"is_none_to{to}"] == (rank != to)
        sender = 1 - rank
        assert result[f"master_diff_to{rank}"] == 0.0
        assert result[f"devices_to{rank}"] == ["cpu"]
        # receiving: the whole fp32 model arrives (the half it owns is copied); sending: one tensor at most
        assert result[f"gathered_growth_to{rank}"] >= 0.95 * model_bytes
        assert result[f"gathered_growth_to{sender}"] <= 2 * tensor_bytes, result
        assert result["all_gather_growth"] >= 0.95 * model_bytes  # the old way: the whole model everywhere
    assert ranks[0]["state_keys_equal"] and ranks[0]["state_diff"] == 0.0
    assert ranks[0]["master_state_diff"] == 0.0 and ranks[0]["state_devices"] == ["cpu"]
    # the sender's growth is its own state_dict() (a copy of its master shard), not the others' shards
    assert ranks[1]["consolidated_is_none"]
    assert ranks[1]["consolidate_growth"] <= ranks[1]["own_master_bytes"] + 2 * tensor_bytes, ranks[1]
