"""sharding/step.py: the step every stage shares (one process; the multi-rank parity is in test_zero1.py,
test_zero12_parity.py and test_zero3_parity.py).

ZeRO-1, ZeRO-2 and ZeRO-3 at world size 1 step exactly like plain AdamW clipped by the float64 global norm;
an fp16 overflow skips the step on each of them and halves the loss scale; each refuses an optimizer that is
not elementwise in one line.
"""

from __future__ import annotations

import copy

import pytest
import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import DynamicLossScaler, Zero1Optimizer, Zero2Optimizer, Zero3Model, Zero3Optimizer
from zero_train.sharding.step import OwnedPiece
from zero_train.sharding.zero3 import state as zero3_state
from zero_train.testing.sharders import TiedNet, batch, clip_with_float64_norm

pytestmark = pytest.mark.tier("quick")

STAGES = ("zero1", "zero2", "zero3")


def _sharded(stage: str, model: TiedNet, optimizer_class=torch.optim.AdamW, **kwargs):
    if stage == "zero3":
        return Zero3Optimizer(Zero3Model(model, unit_modules=[model]), optimizer_class, **kwargs)
    sharder = Zero1Optimizer if stage == "zero1" else Zero2Optimizer
    params = [p for p in model.parameters() if p.requires_grad]
    return sharder(params, optimizer_class, bucket_elements=40, **kwargs)


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_steps_like_plain_adamw_clipped_by_the_float64_norm(stage):
    model, reference = TiedNet(), TiedNet()
    optimizer = _sharded(stage, model, lr=0.05, weight_decay=0.1)
    plain = torch.optim.AdamW(
        [p for p in reference.parameters() if p.requires_grad], lr=0.05, weight_decay=0.1
    )
    assert optimizer.pieces and all(type(owned) is OwnedPiece for owned in optimizer.pieces)
    for step in range(3):
        model(batch(0, step, 0)).backward()
        reference(batch(0, step, 0)).backward()
        norm = optimizer.clip_grad_norm_(0.05)
        expected = clip_with_float64_norm([p for p in reference.parameters() if p.grad is not None], 0.05)
        assert torch.equal(norm, expected)
        optimizer.step()
        optimizer.zero_grad()
        plain.step()
        plain.zero_grad()
        assert not optimizer.last_step_skipped
    names = dict(model.named_parameters())
    for name, expected in reference.named_parameters():
        param = names[name]  # ZeRO-3's parameters hold no bytes between passes: its masters are the values
        value = zero3_state.gathered_param(optimizer, param) if stage == "zero3" else param.detach()
        assert torch.equal(value, expected.detach()), name


@pytest.mark.parametrize("stage", STAGES)
def test_an_fp16_overflow_skips_the_step_on_each_stage_and_halves_the_scale(stage):
    model = TiedNet()
    before = copy.deepcopy(model.state_dict())
    scaler = DynamicLossScaler(init_scale=2.0**16, scale_window=1000, hysteresis=1, min_scale=1.0)
    optimizer = _sharded(stage, model, loss_scaler=scaler, lr=0.05)
    optimizer.scale_loss(model(batch(0, 0, 0)) * float("inf")).backward()
    optimizer.step()
    assert optimizer.last_step_skipped and scaler.loss_scale == 2.0**15
    for name, param in model.named_parameters():
        value = zero3_state.gathered_param(optimizer, param) if stage == "zero3" else param.detach()
        assert torch.equal(value, before[name]), name
    optimizer.zero_grad()
    optimizer.scale_loss(model(batch(0, 1, 0))).backward()
    optimizer.step()
    after = (
        zero3_state.gathered_param(optimizer, model.hidden.weight)
        if stage == "zero3"
        else model.hidden.weight.detach()
    )
    assert not optimizer.last_step_skipped and not torch.equal(after, before["hidden.weight"])


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_refuses_an_optimizer_that_is_not_elementwise_in_one_line(stage):
    with pytest.raises(UsageError, match="elementwise") as refused:
        _sharded(stage, TiedNet(), torch.optim.LBFGS, lr=0.1)
    assert "\n" not in str(refused.value) and "LBFGS" in str(refused.value)
