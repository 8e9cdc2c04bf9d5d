"""Our hand-written ZeRO-2: a plain model, `zero_train.sharding.Zero2Optimizer` does the rest.

As the zero1 engine (checkpoints, export, memory categories), except for where the gradients go: every
micro-batch's backward reduces its gradients to their owners bucket by bucket (buckets of the DeepSpeed
config's zero_optimization.reduce_bucket_size elements) and keeps only the owned ones, as DeepSpeed's
stage 2 does (ZeRO paper, P_os+g: 2 Psi + (2 + K) Psi / Nd bytes per rank in mixed precision).
"""

from __future__ import annotations

import contextlib

import torch

from zero_train.engines.precision import grad_dtypes
from zero_train.engines.zero1 import Zero1Engine
from zero_train.sharding import Zero2Optimizer


class Zero2Engine(Zero1Engine):
    """Plain model + Zero2Optimizer (optimizer state, fp32 masters and gradients sharded over the ranks)."""

    name = "zero2"

    sharder = Zero2Optimizer

    @staticmethod
    def _gradient_dtypes(ds_config: dict) -> dict[str, torch.dtype]:
        """grad_dtype and reduce_dtype from the config: ZeRO-2 sums copies of its buckets, in any dtype."""
        return grad_dtypes(ds_config)

    def _no_sync(self, boundary: bool):
        """Nothing to defer: every micro-batch's backward reduces its buckets (DeepSpeed's stage 2 rule)."""
        return contextlib.nullcontext()
