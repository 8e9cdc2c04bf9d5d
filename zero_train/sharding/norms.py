"""The global gradient norm from pieces of tensors, the same bits however the tensors are cut (no collectives).

A sharder holds pieces of tensors (partition.py), so the global norm adds every piece's partial sum of
|g|^p. Added in float32, the sum would depend on where the cuts fall (a tensor's norm from two halves is
not bit-equal to its norm in one go: 17% of random splits agree); every square of a float32 is exact in
float64, so the partial sums are taken in float64 (as DeepSpeed does, runtime/zero/utils.py
get_norm_dtype) and differ between two cuttings by ~1e-16 relative, far below float32's resolution.
Rounded to float32, the total is then the same number for DDP's whole tensors and for any sharding,
unless the float64 sum lands within that distance of a float32 rounding boundary (about 1e-8 of steps).
The ddp engine takes its norm from here too, so that ddp and our ZeRO clip by the same number.

The pieces are read in chunks of CHUNK_ELEMENTS, so the float64 temporaries stay small (8 MB).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

CHUNK_ELEMENTS = 1 << 20


def sum_of_powers(grads: Sequence[torch.Tensor], norm_type: float = 2.0, *, device=None) -> torch.Tensor:
    """sum(|g|^p) over every element of `grads` in float64 (max |g| for p = inf), a 0-dim tensor on the device.

    Args:
        grads: gradients or pieces of gradients (any shapes, one device).
        norm_type: p (finite, or math.inf).
        device: where the result lives when `grads` is empty.
    """
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


def global_norm(grads: Sequence[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The norm of whole gradients on one rank (ddp, torch-zero): what the sharders compute from pieces."""
    device = grads[0].device if grads else None
    return total_norm(sum_of_powers(grads, norm_type, device=device), norm_type)
