"""Shared pieces of the sharder tests: a tiny model with a tied and a frozen weight, batches, references.

The references are computed from whole tensors with torch, independently of our sharders: a tensor split
across ranks is averaged piece by piece in its owner's ring order (`piece_average`), and the global norm
accumulates in float64 like DeepSpeed's (`clip_with_float64_norm`).
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, WIDTH, HIDDEN, SEQ, BATCH = 16, 8, 12, 5, 3


class TiedNet(nn.Module):
    """Embedding tied to the output head (one tensor, two uses) and a frozen middle layer."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.hidden = nn.Linear(WIDTH, HIDDEN)
        self.frozen = nn.Linear(HIDDEN, HIDDEN)
        self.frozen.requires_grad_(False)
        self.out = nn.Linear(HIDDEN, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.hidden(self.embed(tokens)))
        x = torch.tanh(self.frozen(x))
        logits = self.head(self.out(x))
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def batch(rank: int, step: int, micro: int) -> torch.Tensor:
    """Deterministic token batch of one rank, step and micro-step."""
    generator = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)


def two_groups(model: TiedNet, lr: float) -> list[dict]:
    """Two param groups with different lr and weight decay (the frozen layer rides in the second)."""
    first = [model.embed.weight, model.hidden.weight, model.hidden.bias]
    second = [model.frozen.weight, model.frozen.bias, model.out.weight, model.out.bias]
    return [dict(params=first), dict(params=second, lr=lr * 0.5, weight_decay=0.0)]


def ring_average(grads_by_rank: list[torch.Tensor], owner: int) -> torch.Tensor:
    """The average our gloo ring reduce-scatter computes: ((g[o+1]/N + g[o+2]/N) + ...) + g[o]/N."""
    world_size = len(grads_by_rank)
    order = [(owner + 1 + k) % world_size for k in range(world_size)]
    total = grads_by_rank[order[0]] / world_size
    for rank in order[1:]:
        total = total + grads_by_rank[rank] / world_size
    return total


def stage_average(grads: list[list[torch.Tensor | None]], owner: int, stage: int) -> torch.Tensor | None:
    """The averaged gradient our ZeRO-`stage` hands the optimizer, from grads[rank][micro_step] (None: none).

    ZeRO-1 accumulates each rank's micro-steps locally (as autograd does: m0, then += m1) and averages once
    at the boundary (`ring_average`); ZeRO-2 averages every micro-step as its backward ends and the owner
    accumulates the averages in order. A rank without a gradient counts as zero (DDP's rule); None when no
    rank had one in any micro-step (the optimizer skips the parameter).
    """
    present = [g for per_rank in grads for g in per_rank if g is not None]
    if not present:
        return None
    zero = torch.zeros_like(present[0])

    def accumulate(parts):
        total = None
        for part in parts:
            if part is not None:
                total = part.clone() if total is None else total + part
        return total

    if stage == 1:
        local = [accumulate(per_rank) for per_rank in grads]
        return ring_average([g if g is not None else zero for g in local], owner)
    micro_steps = len(grads[0])
    averages = []
    for micro in range(micro_steps):
        column = [per_rank[micro] for per_rank in grads]
        if all(g is None for g in column):
            averages.append(zero.clone())  # the bucket still travels: zeros, added to the accumulator
            continue
        averages.append(ring_average([g if g is not None else zero for g in column], owner))
    return accumulate(averages)


def piece_average(
    grads: list[list[torch.Tensor | None]], pieces: list[tuple[int, int, int]], stage: int
) -> torch.Tensor | None:
    """`stage_average` of every piece (rank, first element, length) with that piece's owner, joined.

    grads[rank][micro_step] are whole gradients (None: none); each piece is summed in its owner's order.
    """
    present = [g for per_rank in grads for g in per_rank if g is not None]
    if not present:
        return None
    shape = present[0].shape

    def cut(g, offset, length):
        return None if g is None else g.reshape(-1)[offset : offset + length]

    parts = [
        stage_average([[cut(g, offset, length) for g in per_rank] for per_rank in grads], owner, stage)
        for owner, offset, length in pieces
    ]
    return torch.cat(parts).view(shape)


def clip_with_float64_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch's clip_grads_with_norm_ with the global norm accumulated in float64 (whole tensors), as
    DeepSpeed and our engines take it; returns the float32 norm."""
    grads = [p.grad for p in params if p.grad is not None]
    norms64 = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads])
    total = torch.linalg.vector_norm(norms64).to(torch.float32)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
