"""The sharders' view of backward: one call per gradient as it is complete, one when backward ends.

A post-accumulate-grad hook on every trainable parameter calls the optimizer's `on_grad(param)` once the
parameter's gradient of this backward is accumulated (a tied weight: after both uses). The first one of a
backward also calls `on_first_grad()` and queues `on_backward_end()` with autograd, which runs it when the
whole backward has finished. The hooks hold the optimizer weakly: a parameter must not keep a dropped
optimizer (and its buffers) alive.
"""

from __future__ import annotations

import weakref

import torch


class BackwardHooks:
    """Hooks on `params` forwarding to `owner`; the state of the backward in flight lives on the owner, so
    hooks rebuilt in the middle of a backward (a parameter was unfrozen) do not start a second one.

    Args:
        owner: the optimizer: `on_first_grad()`, `on_grad(param)`, `on_backward_end()`, `_in_backward`.
        params: the parameters to hook (all must require gradients: torch refuses a hook otherwise).
    """

    def __init__(self, owner, params: list[torch.nn.Parameter]):
        owner_ref = weakref.ref(owner)

        def arrived(param: torch.Tensor) -> None:
            owner = owner_ref()
            if owner is not None and param.grad is not None:
                _arrived(owner, param)

        self._handles = [param.register_post_accumulate_grad_hook(arrived) for param in params]

    def remove(self) -> None:
        """Detach the hooks (the optimizer re-hooks when the trainable parameters change)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _arrived(owner, param: torch.Tensor) -> None:
    if not owner._in_backward:
        owner._in_backward = True
        owner_ref = weakref.ref(owner)
        torch.autograd.Variable._execution_engine.queue_callback(lambda: _ended(owner_ref))
        owner.on_first_grad()
    owner.on_grad(param)


def _ended(owner_ref) -> None:
    owner = owner_ref()
    if owner is not None:
        owner._in_backward = False
        owner.on_backward_end()
