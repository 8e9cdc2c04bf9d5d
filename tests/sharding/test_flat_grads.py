"""boundary_backward() (the division by N fused into the gradient hooks, the buckets reduced during
backward) changes no bit of training.

One spawned run per world size (2 and 3): a naive Zero1Optimizer (copy in the hooks, divide and reduce at
the boundary) and a fused one (the last micro-batch's hooks write grad / N and start each complete bucket's
reduction) train identical models side by side, in buckets of 60 elements, with accumulation, tied and
frozen weights and two param groups, in fp32 and bf16, with both zero_grad modes; parameters, masters
and gradient norms must be equal bit for bit.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from zero_train.sharding import Zero1Optimizer
from zero_train.sharding.zero12 import state as zero12_state
from zero_train.testing.sharders import TiedNet, batch, two_groups

pytestmark = pytest.mark.tier("multiproc")

STEPS = 3


def _train(rank: int, dtype: torch.dtype, *, accum: int, fused: bool, set_to_none: bool) -> tuple[list, list]:
    """STEPS clipped AdamW steps; returns (parameters, grad norms)."""
    model = TiedNet().to(dtype)
    optimizer = Zero1Optimizer(
        two_groups(model, 3e-2), torch.optim.AdamW, bucket_elements=60, lr=3e-2, foreach=False
    )
    norms = []
    for step in range(STEPS):
        for micro in range(accum):
            last = micro == accum - 1
            context = optimizer.boundary_backward() if fused and last else contextlib.nullcontext()
            with context:
                (model(batch(rank, step, micro)) / accum).backward()
        norms.append(float(optimizer.clip_grad_norm_(0.05)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
    masters = zero12_state.full_master_params(optimizer)
    return [p.detach().clone() for p in model.parameters()] + masters, norms


def _backward_after_boundary_raises() -> str:
    model = TiedNet()
    optimizer = Zero1Optimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    with optimizer.boundary_backward():
        model(batch(0, 0, 0)).backward()
    try:
        model(batch(0, 0, 1)).backward()
    except RuntimeError as err:
        return str(err)
    return "no error"


def _compare(rank: int, world_size: int) -> dict:
    results = {}
    cases = [(d, a, s) for d in (torch.float32, torch.bfloat16) for a in (1, 2) for s in (True, False)]
    for dtype, accum, set_to_none in cases:
        naive = _train(rank, dtype, accum=accum, fused=False, set_to_none=set_to_none)
        fused = _train(rank, dtype, accum=accum, fused=True, set_to_none=set_to_none)
        name = f"{dtype}-accum={accum}-set_to_none={set_to_none}"
        results[name] = dict(
            params_equal=all(torch.equal(a, b) for a, b in zip(naive[0], fused[0], strict=True)),
            norms_equal=naive[1] == fused[1],
            moved=float((naive[0][1] - TiedNet().hidden.weight.to(dtype)).abs().max()),
        )
    results["error"] = _backward_after_boundary_raises()
    return results


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def fused_runs(request, rank_pool):
    return rank_pool(request.param).run(_compare)


def test_fused_division_trains_bit_for_bit_like_the_naive_path(fused_runs):
    for rank_results in fused_runs:
        cases = {k: v for k, v in rank_results.items() if k != "error"}
        assert len(cases) == 8
        for name, result in cases.items():
            assert result["moved"] > 1e-3, name
            assert result["params_equal"], name
            assert result["norms_equal"], name


def test_a_backward_after_the_boundary_backward_raises(fused_runs):
    for rank_results in fused_runs:
        assert "already averaged" in rank_results["error"]
