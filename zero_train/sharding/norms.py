"""The global gradient norm from pieces of tensors, the same bits however the tensors are cut (no collectives).

Partial sums of |g|^p are taken in float64, where every square of a float32 is exact, so the total rounded to
float32 does not depend on where the cuts fall (as DeepSpeed's get_norm_dtype; why: docs/sharding.md). ddp takes
its norm from here too, so ddp and our ZeRO clip by the same number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

CHUNK_ELEMENTS = 1 << 20


def sum_of_powers(grads: Sequence[torch.Tensor], norm_type: float = 2.0, *, device=None) -> torch.Tensor:
    """sum(|g|^p) over every element of `grads` in float64 (max |g| for p = inf), a 0-dim tensor on `device`;
    read in chunks of CHUNK_ELEMENTS, so the float64 temporaries stay small (8 MB)."""
    chunks = [chunk for grad in grads for chunk in grad.detach().reshape(-1).split(CHUNK_ELEMENTS)]
    if not chunks:
        return torch.zeros((), dtype=torch.float64, device=device)
    norms = torch.stack(torch._foreach_norm(chunks, norm_type, dtype=torch.float64))
    return norms.max() if math.isinf(norm_type) else norms.pow(norm_type).sum()


def total_norm(powers: torch.Tensor, norm_type: float = 2.0) -> torch.Tensor:
    """The p-norm from the (all-reduced) sum of powers, rounded to float32, as torch reports norms."""
    if math.isinf(norm_type):
        return powers.to(torch.float32)
    return powers.pow(1.0 / norm_type).to(torch.float32)


def clip_coefficient(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grads_with_norm_'s factor, min(1, max_norm / (norm + 1e-6)), kept on the device."""
    return torch.clamp(max_norm / (norm + 1e-6), max=1.0)
