"""zero_train.numerics.NonFiniteGuard: stop / skip policies and fp16 loss-scale skipping."""

from __future__ import annotations

import math

import pytest
import torch

from zero_train.numerics import NonFiniteError, NonFiniteGuard


def real_step_values(lr: float) -> tuple[float, float]:
    """Loss and grad norm of a real step of a tiny regression after one update at `lr`."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    data, target = torch.randn(16, 8) * 1e3, torch.randn(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(6):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        optimizer.step()
    grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    return float(loss.detach()), float(grad_norm)


def test_stop_names_step_value_cause_and_flag():
    guard = NonFiniteGuard("stop")
    loss, grad_norm = real_step_values(lr=1e-9)
    assert math.isfinite(loss) and math.isfinite(grad_norm)
    guard.check(step=1, loss=loss, grad_norm=grad_norm, skipped=False)
    loss, grad_norm = real_step_values(lr=10.0)  # diverges to inf/nan
    assert not math.isfinite(loss)
    with pytest.raises(NonFiniteError) as info:
        guard.check(step=7, loss=loss, grad_norm=grad_norm, skipped=False)
    message = str(info.value)
    assert message.startswith("step 7: non-finite loss ")
    assert "learning rate too high" in message and "fp16 overflow" in message and "bad data" in message
    assert "--on-nonfinite skip" in message and "\n" not in message


def test_grad_norm_alone_and_precision_specific_cause():
    with pytest.raises(NonFiniteError, match="step 3: non-finite grad norm inf; likely cause: fp16 overflow"):
        NonFiniteGuard("stop", precision="fp16").check(step=3, loss=2.5, grad_norm=math.inf, skipped=False)
    with pytest.raises(
        NonFiniteError, match=r"grad norm nan; likely cause: learning rate too high \(lower --lr"
    ):
        NonFiniteGuard("stop", precision="bf16").check(step=3, loss=2.5, grad_norm=math.nan, skipped=False)


def test_skip_policy_warns_then_stops_after_too_many_in_a_row():
    guard = NonFiniteGuard("skip", max_consecutive=3)
    for step in (1, 2):
        with pytest.warns(
            UserWarning, match=f"step {step}: non-finite loss nan.*skipped under --on-nonfinite skip"
        ):
            guard.check(step=step, loss=math.nan, grad_norm=1.0, skipped=False)
    guard.check(step=3, loss=1.0, grad_norm=1.0, skipped=False)  # a finite step resets the count
    for step in (4, 5):
        with pytest.warns(UserWarning):
            guard.check(step=step, loss=math.inf, grad_norm=None, skipped=False)
    with pytest.raises(NonFiniteError, match="step 6: .*3 steps in a row under --on-nonfinite skip"):
        guard.check(step=6, loss=math.nan, grad_norm=math.nan, skipped=False)
    assert guard.nonfinite_steps == [1, 2, 4, 5, 6]


def test_fp16_overflow_skips_are_tolerated_under_stop_until_the_scale_cannot_help():
    from zero_train.engines.precision import DynamicLossScaler

    scaler = DynamicLossScaler(init_scale=16, scale_window=1000, hysteresis=1, min_scale=1.0)
    guard = NonFiniteGuard("stop", precision="fp16", max_consecutive_skipped=10)
    for step in range(9):  # real overflow steps: the scaler lowers the scale, the guard lets them pass
        scaler.update_scale(True)
        guard.check(step=step, loss=1.0, grad_norm=math.inf, skipped=True)
    assert scaler.loss_scale == 1.0
    guard.check(step=9, loss=1.0, grad_norm=0.5, skipped=False)  # a good step resets the count
    for step in range(10, 19):
        guard.check(step=step, loss=math.nan, grad_norm=math.inf, skipped=True)
    with pytest.raises(
        NonFiniteError, match="step 19: 10 optimizer steps in a row skipped for fp16 overflow"
    ):
        guard.check(step=19, loss=math.nan, grad_norm=math.inf, skipped=True)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="--on-nonfinite must be one of stop, skip"):
        NonFiniteGuard("ignore")
