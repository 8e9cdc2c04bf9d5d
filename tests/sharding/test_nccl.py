"""The NCCL path of our ZeRO-1/2 reduction, run on gloo ranks by forcing torch's collectives (ZT_TORCH_COLLECTIVES=1).

On NCCL each bucket is reduced to its owners by ONE collective (comm/nccl.reduce_scatter_parts: a
reduce_scatter of the owners' unequal parts, which ProcessGroupNCCL runs as one group of ncclReduce calls; equal
parts go to reduce_scatter_tensor), where it used to take one `reduce` per owner. Forced on gloo, the same code
runs here: the CommLedger counts exactly one reduce-scatter per bucket (per micro-step for ZeRO-2), no reduce,
no point-to-point message, and the trained parameters equal those of our gloo rings (3 ranks: the two sum the
ranks in different orders, so within fp32 rounding).
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from zero_train.comm.ledger import CommLedger
from zero_train.sharding import Zero1Optimizer, Zero2Optimizer
from zero_train.sharding.comm.groups import TORCH_COLLECTIVES_ENV
from zero_train.testing import run_ranks
from zero_train.testing.sharders import TiedNet, batch

pytestmark = pytest.mark.tier("multiproc")

STEPS, ACCUM, BUCKET = 3, 2, 100


def _train(rank: int, stage: int, torch_collectives: bool) -> dict:
    os.environ[TORCH_COLLECTIVES_ENV] = "1" if torch_collectives else "0"
    model = TiedNet()
    sharder = Zero1Optimizer if stage == 1 else Zero2Optimizer
    optimizer = sharder(model.parameters(), torch.optim.AdamW, bucket_elements=BUCKET, lr=3e-2, foreach=False)
    buckets = [bucket for store in optimizer._stores for bucket in store.buckets]
    calls = []
    for step in range(STEPS):
        with CommLedger() as ledger:
            for micro in range(ACCUM):
                last = micro == ACCUM - 1
                boundary = optimizer.boundary_backward() if stage == 1 and last else contextlib.nullcontext()
                with boundary:
                    (model(batch(rank, step, micro)) / ACCUM).backward()
            optimizer.clip_grad_norm_(1.0)
            optimizer.step()
            optimizer.zero_grad()
        calls.append({name: count for name, count in ledger.calls.items() if count})
    params = torch.cat(
        [p.detach().reshape(-1) for p in model.parameters()]
    ).tolist()  # plain data crosses processes
    return dict(
        calls=calls, buckets=len(buckets), owners=[sum(map(bool, b.lengths)) for b in buckets], params=params
    )


def _both_paths(rank: int, world_size: int) -> dict:
    return {(stage, forced): _train(rank, stage, forced) for stage in (1, 2) for forced in (False, True)}


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return run_ranks(_both_paths, 3, timeout_s=240)


@pytest.mark.parametrize("stage", [1, 2])
def test_one_reduce_scatter_per_bucket_and_the_rings_parameters(runs, stage):
    for by_case in runs:
        forced, rings = by_case[stage, True], by_case[stage, False]
        assert forced["buckets"] >= 3 and max(forced["owners"]) >= 2  # buckets that span owners
        reductions = forced["buckets"] * (ACCUM if stage == 2 else 1)
        for calls in forced["calls"]:  # clipping's one all-reduce, the all-gather, one collective per bucket
            assert calls == {"reduce_scatter": reductions, "all_reduce": 1, "all_gather": 1}
        assert all("reduce_scatter" not in calls and calls["send_recv"] > 0 for calls in rings["calls"])
        torch.testing.assert_close(
            torch.tensor(forced["params"]), torch.tensor(rings["params"]), rtol=1e-5, atol=1e-6
        )
