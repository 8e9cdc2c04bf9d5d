"""Our sharders behave as a plain torch optimizer does where its users rely on it (docs/zero1.md).

One spawned run per world size (2 and 3) trains, for every inner optimizer, a model in which
- a branch is used by every rank on some steps, by rank 0 only on others, and by no rank on the rest
  (no rank: the branch must be skipped exactly as torch skips a parameter whose .grad is None; some
  ranks: a missing gradient counts as zero in the average, DDP's rule),
- a layer frozen at construction is unfrozen mid-run (it must then train),
- a layer is frozen mid-run (from then on: no update, no state change, no traffic),
- one inner optimizer halves its own lr at every step and adds a key to its param groups.
The reference is the plain optimizer over the same param groups, stepping on gradients averaged in the
order our rings sum (`ring_average`, a missing gradient as zero); in fp32 it must match BIT FOR BIT.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zero_train.sharding import Zero1Optimizer, Zero2Optimizer
from zero_train.sharding.zero12 import report as zero12_report
from zero_train.sharding.zero12 import state as zero12_state
from zero_train.testing import run_ranks
from zero_train.testing.sharders import VOCAB, batch, clip_with_float64_norm, piece_average

pytestmark = pytest.mark.tier("multiproc")

STEPS, ACCUM, UNFREEZE_AT, FREEZE_AT = 9, 1, 3, 5  # one micro-step: an unfrozen layer's first
# gradient comes from a backward that has no hook for it yet (accumulation: tests/sharding/test_zero12_parity.py)
SHARDERS = {
    1: Zero1Optimizer,
    2: lambda *args, **kwargs: Zero2Optimizer(*args, bucket_elements=100, **kwargs),
}


class HalvingSGD(torch.optim.SGD):
    """An optimizer that edits its own param_groups: halves its lr after every step and counts them."""

    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            group["lr"] *= 0.5
            group["halvings"] = group.get("halvings", 0) + 1
        return loss


CASES = {
    "adamw": (torch.optim.AdamW, dict(lr=3e-2, weight_decay=0.1, foreach=False), 0.05),
    "adam": (torch.optim.Adam, dict(lr=3e-2, foreach=False), None),
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01, foreach=False), 1e9),
    "halving_sgd": (HalvingSGD, dict(lr=0.2, momentum=0.5, foreach=False), None),
}


class BranchNet(nn.Module):
    """An embedding, a trunk, a branch that is not always taken, a late layer frozen at construction."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 8)
        self.trunk = nn.Linear(8, 8)
        self.branch = nn.Linear(8, 8)
        self.late = nn.Linear(8, 8)
        self.late.requires_grad_(False)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, tokens: torch.Tensor, use_branch: bool) -> torch.Tensor:
        x = torch.tanh(self.trunk(self.embed(tokens)))
        if use_branch:
            x = x + torch.tanh(self.branch(x))
        logits = self.head(torch.tanh(self.late(x)))
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def uses_branch(rank: int, step: int) -> bool:
    """Every rank on steps 0, 3, 6; rank 0 only on 1, 4, 7; no rank on 2, 5, 8."""
    return step % 3 == 0 or (step % 3 == 1 and rank == 0)


def schedule(model: BranchNet, step: int) -> None:
    """Progressive unfreezing of `late`, freezing of `trunk`: the same on every rank."""
    if step == UNFREEZE_AT:
        model.late.requires_grad_(True)
    if step == FREEZE_AT:
        model.trunk.requires_grad_(False)


def groups(model: BranchNet, lr: float) -> list[dict]:
    first = [model.embed.weight, model.trunk.weight, model.trunk.bias, model.late.weight, model.late.bias]
    second = [model.branch.weight, model.branch.bias, model.head.weight, model.head.bias]
    return [dict(params=first), dict(params=second, lr=lr * 0.5, weight_decay=0.0)]


def _rank_grads(model: BranchNet, world_size: int, step: int) -> list[list[list[torch.Tensor | None]]]:
    """grads[parameter][rank][micro_step]: what each micro-step alone contributes (None: no gradient)."""
    params = list(model.parameters())
    grads = [[[] for _ in range(world_size)] for _ in params]
    for rank in range(world_size):
        for micro in range(ACCUM):
            model.zero_grad(set_to_none=True)
            (model(batch(rank, step, micro), uses_branch(rank, step)) / ACCUM).backward()
            for index, param in enumerate(params):
                grads[index][rank].append(None if param.grad is None else param.grad.clone())
    return grads


def _reference_step(
    model, plain, world_size: int, step: int, pieces_of, max_norm, stage: int
) -> float | None:
    """The plain optimizer's step on the averages our ZeRO-`stage` computes (piece_average)."""
    grads = _rank_grads(model, world_size, step)
    for param, per_rank in zip(model.parameters(), grads, strict=True):
        param.grad = piece_average(per_rank, pieces_of(param), stage)
    norm = None
    if max_norm is not None:
        with_grad = [p for g in plain.param_groups for p in g["params"] if p.grad is not None]
        norm = float(clip_with_float64_norm(with_grad, max_norm))
    plain.step()
    return norm


def _train(rank: int, world_size: int, case: str, stage: int) -> dict:
    optimizer_class, kwargs, max_norm = CASES[case]
    model, reference = BranchNet(), BranchNet()
    sharded = SHARDERS[stage](groups(model, kwargs["lr"]), optimizer_class, **kwargs)
    plain = optimizer_class(groups(reference, kwargs["lr"]), **kwargs)
    names = [name for name, _ in model.named_parameters()]
    twin = dict(zip((id(p) for p in reference.parameters()), model.parameters(), strict=True))

    def pieces_of(param):
        return zero12_report.pieces_of(sharded, twin[id(param)])

    norm_diffs, trunk_before_freeze = [], None
    for step in range(STEPS):
        schedule(model, step)
        schedule(reference, step)
        for micro in range(ACCUM):
            (model(batch(rank, step, micro), uses_branch(rank, step)) / ACCUM).backward()
        sharded.reduce_gradients()
        if max_norm is not None:
            norm = float(sharded.clip_grad_norm_(max_norm))
        sharded.step()
        sharded.zero_grad()
        ref_norm = _reference_step(reference, plain, world_size, step, pieces_of, max_norm, stage)
        if max_norm is not None:
            norm_diffs.append(abs(norm - ref_norm))
        if step == FREEZE_AT - 1:
            trunk_before_freeze = model.trunk.weight.detach().clone()
    consolidated = zero12_state.consolidated_state_dict(sharded)
    plain_state = plain.state_dict()
    return dict(
        diffs={
            name: float((a - b).detach().abs().max())
            for name, a, b in zip(names, model.parameters(), reference.parameters(), strict=True)
        },
        norm_diff=max(norm_diffs, default=0.0),
        late_moved=float((model.late.weight - BranchNet().late.weight).detach().abs().max()),
        trunk_frozen=bool(torch.equal(model.trunk.weight, trunk_before_freeze)),
        lrs=[g["lr"] for g in sharded.param_groups],
        ref_lrs=[g["lr"] for g in plain.param_groups],
        halvings=[g.get("halvings") for g in sharded.param_groups],
        ref_halvings=[g.get("halvings") for g in plain.param_groups],
        state_steps=None
        if consolidated is None
        else {k: float(v["step"]) for k, v in consolidated["state"].items() if "step" in v},
        ref_state_steps={k: float(v["step"]) for k, v in plain_state["state"].items() if "step" in v},
    )


def _all_cases(rank: int, world_size: int) -> dict:
    return {(stage, case): _train(rank, world_size, case, stage) for stage in SHARDERS for case in CASES}


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def runs(request):
    return run_ranks(_all_cases, request.param)


@pytest.mark.parametrize("stage", SHARDERS, ids=["zero1", "zero2"])
@pytest.mark.parametrize("case", CASES)
def test_unused_frozen_and_unfrozen_parameters_train_like_torch_bit_for_bit(runs, case, stage):
    for rank_results in runs:
        result = rank_results[stage, case]
        assert result["diffs"] == {name: 0.0 for name in result["diffs"]}
        assert result["norm_diff"] == 0.0
        assert result["late_moved"] > 1e-4  # unfrozen mid-run, then trained
        assert result["trunk_frozen"]  # frozen mid-run: not moved by momentum or weight decay


@pytest.mark.parametrize("stage", SHARDERS, ids=["zero1", "zero2"])
def test_skipped_parameters_keep_their_state_like_torch(runs, stage):
    for case in ("adamw", "adam"):
        result = runs[0][stage, case]
        # Adam's per-parameter step counts: the branch skips the steps no rank used it, trunk the frozen ones
        assert result["state_steps"] == result["ref_state_steps"]
        steps = result["ref_state_steps"]
        assert len(set(steps.values())) >= 3  # the counts really differ between parameters


@pytest.mark.parametrize("stage", SHARDERS, ids=["zero1", "zero2"])
def test_param_groups_sync_both_ways(runs, stage):
    for rank_results in runs:
        result = rank_results[stage, "halving_sgd"]
        assert result["lrs"] == result["ref_lrs"] == [0.2 * 0.5**STEPS, 0.1 * 0.5**STEPS]
        assert result["halvings"] == result["ref_halvings"] == [STEPS, STEPS]


@pytest.mark.tier("quick")
@pytest.mark.parametrize("stage", SHARDERS, ids=["zero1", "zero2"])
def test_sparse_gradients_are_refused_with_a_value_error(stage):
    embedding = nn.Embedding(10, 4, sparse=True)
    optimizer = SHARDERS[stage](embedding.parameters(), torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="sparse"):
        embedding(torch.tensor([1, 2])).sum().backward()
        optimizer.step()
