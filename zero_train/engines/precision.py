"""fp32 master weights for a bf16/fp16 model, as DeepSpeed keeps them (used by ddp and torch-zero).

The model computes in its low-precision dtype; the optimizer owns fp32 copies. At each boundary the
averaged low-precision gradients are copied into the fp32 copies (unscaled by the fp16 loss scale),
the optimizer updates the fp32 copies, and the result is rounded back into the model. In fp32 the
"master" parameters are the model's own parameters and nothing is copied.
"""

from __future__ import annotations

import torch

from zero_train.ds_config.parse import gradient_dtypes
from zero_train.sharding.loss_scale import DynamicLossScaler

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


def grad_dtypes(ds_config: dict) -> dict[str, torch.dtype]:
    """The sharders' grad_dtype / reduce_dtype keywords from the config (fp32 unless it says otherwise)."""
    accumulate, communicate = gradient_dtypes(ds_config)
    return dict(grad_dtype=PRECISION_DTYPES[accumulate], reduce_dtype=PRECISION_DTYPES[communicate])
