"""fp16 dynamic loss scaling for Zero1Optimizer.

The scaler follows DeepSpeed's rules (runtime/fp16/loss_scaler.py) and is shared with the ddp engine,
which tests it against DeepSpeed's own class; Zero1Optimizer only needs `.loss_scale` and
`.update_scale(overflow)` (and `state_dict` / `load_state_dict` for checkpoints).

    scaler = DynamicLossScaler(init_scale=2.0**16, scale_window=1000, hysteresis=2, min_scale=1.0)
    optimizer = Zero1Optimizer(params, torch.optim.AdamW, loss_scaler=scaler, lr=1e-4)
"""

from __future__ import annotations

from zero_train.engines.precision import DynamicLossScaler

__all__ = ["DynamicLossScaler"]
