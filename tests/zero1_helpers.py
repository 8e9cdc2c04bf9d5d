"""Shared pieces of the Zero1Optimizer tests: a tiny model with a tied and a frozen weight, batches, references."""

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
