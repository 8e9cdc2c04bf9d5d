"""fp16 dynamic loss scaling with DeepSpeed's rules, for our sharders and the ddp / torch-zero engines.

The scaler follows DeepSpeed's runtime/fp16/loss_scaler.py (tests/engines/test_engines.py checks it against
DeepSpeed's own class); the sharders only need `.loss_scale` and `.update_scale(overflow)` (and
`state_dict` / `load_state_dict` for checkpoints). engines/precision.py builds it from the settings.

    scaler = DynamicLossScaler(init_scale=2.0**16, scale_window=1000, hysteresis=2, min_scale=1.0)
    optimizer = Zero1Optimizer(params, torch.optim.AdamW, loss_scaler=scaler, lr=1e-4)
"""

from __future__ import annotations


class DynamicLossScaler:
    """fp16 dynamic loss scaling with DeepSpeed's rules (runtime/fp16/loss_scaler.py).

    On overflow the step is skipped and, once the hysteresis is used up, the scale halves (not below
    min_scale); after `scale_window` steps without overflow since the last one, it doubles.

    Args:
        init_scale: the first scale, 2**fp16_initial_scale_power.
        scale_window: overflow-free steps before doubling.
        hysteresis: overflows tolerated (without halving) before the scale drops.
        min_scale: the scale never goes below this.
        dynamic: False for DeepSpeed's static `loss_scale` > 0 (overflowing steps are still skipped).
    """

    def __init__(
        self, *, init_scale: float, scale_window: int, hysteresis: int, min_scale: float, dynamic: bool = True
    ):
        self.loss_scale = float(init_scale)
        self.scale_window = scale_window
        self.hysteresis = hysteresis
        self.min_scale = float(min_scale)
        self.cur_hysteresis = hysteresis
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.dynamic = dynamic

    def update_scale(self, overflow: bool) -> None:
        """Record one step's outcome and adjust the scale."""
        if not self.dynamic:
            return
        if overflow:
            if self.hysteresis == 1 or self.cur_hysteresis == 1:
                self.loss_scale = max(self.loss_scale / 2.0, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            stable_interval = self.cur_iter - self.last_overflow_iter - 1
            if stable_interval > 0 and stable_interval % self.scale_window == 0:
                self.cur_hysteresis = self.hysteresis
                self.loss_scale *= 2.0
        self.cur_iter += 1

    def state_dict(self) -> dict:
        """Everything needed to resume the scale trajectory."""
        return dict(
            loss_scale=self.loss_scale,
            cur_hysteresis=self.cur_hysteresis,
            cur_iter=self.cur_iter,
            last_overflow_iter=self.last_overflow_iter,
        )

    def load_state_dict(self, state: dict) -> None:
        """Restore a state written by `state_dict()`."""
        self.loss_scale = float(state["loss_scale"])
        self.cur_hysteresis = int(state["cur_hysteresis"])
        self.cur_iter = int(state["cur_iter"])
        self.last_overflow_iter = int(state["last_overflow_iter"])
