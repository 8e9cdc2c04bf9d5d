"""How ZeRO-3 sees a module's backward begin and end (the same two hooks FSDP2 uses).

Begin: a hook on every tensor the module's forward returned (that requires a gradient) fires when the first
gradient of those outputs is computed, before any of the module's own backward runs: gather its units there.
End: the module's tensor inputs pass through an identity autograd function (`_PostBackward`) whose backward
runs once the gradients of those inputs are computed, i.e. after the module's whole backward: free there.
A module whose inputs take no gradient (the embeddings: token ids) is freed when backward ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(eq=False)
class BackwardCall:
    """One forward call of a hook point, seen from backward."""

    point: object
    """The hook point (units.HookPoint) that ran."""
    acquired: bool = False
    """Its units were gathered for this call's backward."""
    released: bool = False
    """Its units were released after this call's backward."""


def in_backward() -> bool:
    """True while autograd runs a backward pass on this thread (e.g. activation checkpointing recomputes)."""
    return torch._C._current_graph_task_id() != -1


def output_tensors(output) -> list[torch.Tensor]:
    """The tensors in a forward's output (tensors, tuples, lists, dicts, ModelOutput) that take a gradient."""
    if isinstance(output, torch.Tensor):
        return [output] if output.requires_grad else []
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [tensor for item in output for tensor in output_tensors(item)]
    return []


class _PostBackward(torch.autograd.Function):
    """Identity on the inputs; its backward calls `on_done` once their gradients are computed."""

    @staticmethod
    def forward(ctx, on_done, *inputs):
        ctx.on_done = on_done
        return inputs

    @staticmethod
    def backward(ctx, *grads):
        ctx.on_done()
        return (None, *grads)


def wrap_inputs(args: tuple, kwargs: dict, on_done):
    """(args, kwargs) with their top-level tensors that take a gradient passed through `_PostBackward`, or None
    when there are none (the module's backward end is then the end of backward)."""
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    names = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    if not positions and not names:
        return None
    wrapped = _PostBackward.apply(on_done, *[args[i] for i in positions], *[kwargs[k] for k in names])
    args, kwargs = list(args), dict(kwargs)
    for slot, tensor in zip([*positions, *names], wrapped, strict=True):
        if isinstance(slot, int):
            args[slot] = tensor
        else:
            kwargs[slot] = tensor
    return tuple(args), kwargs
