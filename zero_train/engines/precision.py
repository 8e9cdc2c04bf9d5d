"""fp32 master weights for a bf16/fp16 model, as DeepSpeed keeps them (used by ddp and torch-zero).

The model computes in its low-precision dtype; the optimizer owns fp32 copies. At each boundary the
averaged low-precision gradients are copied into the fp32 copies (unscaled by the fp16 loss scale),
the optimizer updates the fp32 copies, and the result is rounded back into the model. In fp32 the
"master" parameters are the model's own parameters and nothing is copied.
"""

from __future__ import annotations

import torch

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class MasterWeights:
    """The parameters the optimizer updates, and the copies between them and the model.

    Args:
        model_params: the model's parameters (already in the model dtype).
        precision: "fp32" | "bf16" | "fp16".
    """

    def __init__(self, model_params: list[torch.nn.Parameter], *, precision: str):
        self.model_params = list(model_params)
        self.has_copies = precision != "fp32"
        if self.has_copies:
            self.master_params = [torch.nn.Parameter(p.detach().float().clone()) for p in self.model_params]
        else:
            self.master_params = self.model_params

    def grads_to_master(self, *, inv_scale: float = 1.0) -> None:
        """Copy the model's (averaged) gradients into the fp32 masters, times `inv_scale`."""
        if not self.has_copies:
            if inv_scale != 1.0:
                for param in self.model_params:
                    if param.grad is not None:
                        param.grad.mul_(inv_scale)
            return
        for model_param, master in zip(self.model_params, self.master_params, strict=True):
            if model_param.grad is None:
                master.grad = None
                continue
            master.grad = model_param.grad.float()
            if inv_scale != 1.0:
                master.grad.mul_(inv_scale)

    def master_to_model(self) -> None:
        """Round the updated fp32 masters into the model's parameters."""
        if not self.has_copies:
            return
        with torch.no_grad():
            for model_param, master in zip(self.model_params, self.master_params, strict=True):
                model_param.copy_(master)

    def model_to_master(self) -> None:
        """Refresh the masters from the model (after the model's weights were loaded)."""
        if not self.has_copies:
            return
        with torch.no_grad():
            for model_param, master in zip(self.model_params, self.master_params, strict=True):
                master.copy_(model_param)

    def zero_grad(self) -> None:
        """Drop the gradients of the model and of the masters."""
        for param in self.model_params:
            param.grad = None
        if self.has_copies:
            for master in self.master_params:
                master.grad = None

    def grads_finite(self) -> bool:
        """True if no master gradient holds inf or NaN (fp16 overflow check, local to this rank)."""
        return all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in self.master_params)


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


def make_loss_scaler(settings) -> DynamicLossScaler | None:
    """The loss scaler for fp16 settings (static if fp16.loss_scale > 0, as in DeepSpeed), None otherwise."""
    if settings.precision != "fp16":
        return None
    if settings.fp16_loss_scale > 0:
        return DynamicLossScaler(
            init_scale=settings.fp16_loss_scale,
            scale_window=1,
            hysteresis=1,
            min_scale=settings.fp16_loss_scale,
            dynamic=False,
        )
    return DynamicLossScaler(
        init_scale=2.0**settings.fp16_initial_scale_power,
        scale_window=settings.fp16_loss_scale_window,
        hysteresis=settings.fp16_hysteresis,
        min_scale=settings.fp16_min_loss_scale,
    )
