"""Zero1Optimizer and Zero2Optimizer train exactly like unsharded training with averaged gradients.

One spawned run per world size (2 and 3) does every check for both sharders (fp32 and bf16) and returns
numbers; the tests assert. The unsharded reference runs inside each rank: it computes every rank's
gradients itself, averages them in the order our gloo rings sum (`ring_average`: divide by N, then add
starting at the owner's right neighbour, piece by piece where a tensor is split between owners; ZeRO-1
once per step over the accumulated gradients, ZeRO-2 once per micro-step, then accumulated:
`piece_average`), clips with torch's clip_grads_with_norm_ by the float64-accumulated global norm and
steps the plain optimizer. The optimizers are elementwise, so the sharded update must equal the reference BIT
FOR BIT: the tolerance is zero.
"""

from __future__ import annotations

import math

import pytest
import torch

from zero_train.comm.ledger import CommLedger
from zero_train.sharding import Zero1Optimizer, Zero2Optimizer
from zero_train.sharding.zero12 import report as zero12_report
from zero_train.sharding.zero12 import state as zero12_state
from zero_train.testing.sharders import TiedNet, batch, clip_with_float64_norm, piece_average, two_groups

pytestmark = pytest.mark.tier("multiproc")

STEPS, ACCUM = 10, 2
CASES = {
    # name: (optimizer class, kwargs, max_norm for clipping or None)
    "adamw": (torch.optim.AdamW, dict(lr=3e-2, weight_decay=0.1, foreach=False), 0.05),
    "adam": (torch.optim.Adam, dict(lr=3e-2, foreach=False), math.inf),
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01, foreach=False), None),
}


SHARDERS = {
    1: Zero1Optimizer,
    2: lambda *args, **kwargs: Zero2Optimizer(*args, bucket_elements=100, **kwargs),
}


def _reference_grads(model: TiedNet, world_size: int, step: int) -> list[list[list[torch.Tensor]]]:
    """grads[trainable parameter][rank][micro_step], each micro-step's own gradient, computed locally."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    grads = [[[] for _ in range(world_size)] for _ in trainable]
    for rank in range(world_size):
        for micro in range(ACCUM):
            model.zero_grad(set_to_none=True)
            (model(batch(rank, step, micro)) / ACCUM).backward()
            for index, param in enumerate(trainable):
                grads[index][rank].append(param.grad.clone())
    return grads


def _train_pair(rank: int, world_size: int, case: str, dtype: torch.dtype, stage: int) -> dict:
    """10 steps of our ZeRO-`stage` and of the reference; returns the largest differences seen."""
    optimizer_class, kwargs, max_norm = CASES[case]
    model, reference = TiedNet().to(dtype), TiedNet().to(dtype)
    sharded = SHARDERS[stage](two_groups(model, kwargs["lr"]), optimizer_class, **kwargs)
    ref_params = [p for p in reference.parameters() if p.requires_grad]
    masters = [p.detach().float().clone().requires_grad_(True) for p in ref_params]
    ref_groups = two_groups(reference, kwargs["lr"])
    master_of = {id(p): m for p, m in zip(ref_params, masters, strict=True)}
    plain = optimizer_class(
        [{**g, "params": [master_of.get(id(p), p) for p in g["params"]]} for g in ref_groups], **kwargs
    )
    model_trainable = [p for p in model.parameters() if p.requires_grad]
    pieces = [zero12_report.pieces_of(sharded, p) for p in model_trainable]
    norm_diffs, micro_step_bytes = [], 0
    for step in range(STEPS):
        grads_by_rank = _reference_grads(reference, world_size, step)
        for i, (master, param) in enumerate(zip(masters, ref_params, strict=True)):
            master.grad = piece_average(grads_by_rank[i], pieces[i], stage).float()
            param.grad = None
        if max_norm is not None:
            ref_norm = clip_with_float64_norm(masters, max_norm)
        plain.step()
        with torch.no_grad():
            for master, param in zip(masters, ref_params, strict=True):
                param.copy_(master)

        for micro in range(ACCUM):
            with CommLedger() as ledger:
                (model(batch(rank, step, micro)) / ACCUM).backward()
            micro_step_bytes += ledger.totals()["total"]
        sharded.reduce_gradients()
        if max_norm is not None:
            norm = sharded.clip_grad_norm_(max_norm)
            norm_diffs.append(float((norm - ref_norm).abs()))
        sharded.step()
        sharded.zero_grad()
    full_masters = zero12_state.full_master_params(sharded)
    trainable = [
        i for i, p in enumerate(p for g in sharded.param_groups for p in g["params"]) if p.requires_grad
    ]
    return dict(
        param_diff=max(
            float((a - b).abs().max())
            for a, b in zip(model.parameters(), reference.parameters(), strict=True)
        ),
        master_diff=max(
            float((full_masters[i] - m).abs().max()) for i, m in zip(trainable, masters, strict=True)
        ),
        norm_diff=max(norm_diffs, default=0.0),
        micro_step_bytes=micro_step_bytes,
        moved=float((model.hidden.weight - TiedNet().hidden.weight.to(dtype)).abs().max()),
        tied=model.head.weight is model.embed.weight,
        split=sum(len(p) > 1 for p in pieces),
        frozen_unchanged=bool(torch.equal(model.frozen.weight, TiedNet().frozen.weight.to(dtype))),
    )


def _all_cases(rank: int, world_size: int) -> dict:
    results = {}
    for stage in SHARDERS:
        results.update(
            {(stage, case): _train_pair(rank, world_size, case, torch.float32, stage) for case in CASES}
        )
        results[stage, "bf16_adamw"] = _train_pair(rank, world_size, "adamw", torch.bfloat16, stage)
    return results


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def parity_runs(request, rank_pool):
    return rank_pool(request.param).run(_all_cases)


@pytest.mark.parametrize("stage", SHARDERS, ids=["zero1", "zero2"])
@pytest.mark.parametrize("case", [*CASES, "bf16_adamw"])
def test_sharded_training_equals_unsharded_bit_for_bit(parity_runs, case, stage):
    for rank_results in parity_runs:
        result = rank_results[stage, case]
        assert result["moved"] > 1e-3  # the parameters really trained
        assert result["split"] >= 1  # some tensor is split between owners (updated piece by piece)
        assert result["param_diff"] == 0.0
        assert result["master_diff"] == 0.0
        assert result["norm_diff"] == 0.0  # the same global norm, so the same clipping


def test_tied_and_frozen_parameters_and_where_backward_communicates(parity_runs):
    for rank_results in parity_runs:
        for (stage, _), result in rank_results.items():
            assert result["tied"] and result["frozen_unchanged"]
            if stage == 1:
                assert result["micro_step_bytes"] == 0  # ZeRO-1: backward never communicates
            else:
                assert result["micro_step_bytes"] > 0  # ZeRO-2: every micro-step reduces its buckets
