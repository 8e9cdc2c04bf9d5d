"""ZeRO-3's units: which parameters are gathered together, and a unit's flat storage on this rank.

A unit is the parameters one all-gather brings: by default each transformer block (the classes a Hugging Face
model lists in `_no_split_modules`), the input embeddings, the output head, and the root (what is left: GPT-2's
position embeddings and final norm). `choose_unit_modules` picks them; a list of modules overrides it.

A hook point is a module whose forward needs units gathered: every unit module. Its scope is the parameters
reachable from it that no nested unit module reaches. A parameter belongs to ONE unit, the first hook point in
module order whose scope holds it, so a tied weight (GPT-2's lm_head.weight is transformer.wte.weight) lives in
the embedding's unit, and the head's hook point needs that unit without owning anything.

    unit.partition   partition.flat_partition of its parameters over the N ranks (element-balanced)
    unit.shard       this rank's slice: P elements in the model's dtype, the only lasting copy of the weights
    unit.flat        the gathered buffer of N P elements; the parameters are views of it, always: their shapes
                     stay, their bytes exist only while the unit is gathered (its storage is resized to 0)
    unit.grad        this rank's slice of the averaged gradients (P elements) while a step accumulates them

Refilling the buffer between forward and backward is hidden from autograd's version counter (as torch's
_unsafe_preserve_version_counter does, the tool for exactly this: free a saved tensor's bytes and bring the same
values back before backward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding.partition import FlatPartition, flat_partition


def choose_unit_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose parameters are gathered together, for any Hugging Face causal LM.

    Decoder layers (classes in `model._no_split_modules`), `get_input_embeddings()`, `get_output_embeddings()`
    and the model itself (the root), in module order.

    Raises:
        UsageError: the model names no block class (the whole model would be one unit: nothing saved).
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    chosen = {id(m) for m in model.modules() if type(m).__name__ in names}
    if not chosen:
        raise UsageError(
            f"{type(model).__name__} lists no transformer block class (_no_split_modules); "
            "the zero3 engine gathers one block at a time: pass units=[...] or use a model that names its blocks"
        )
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, getter, lambda: None)()
        if isinstance(module, torch.nn.Module):
            chosen.add(id(module))
    chosen.add(id(model))
    return [m for m in model.modules() if id(m) in chosen]


@dataclass(eq=False)
class HookPoint:
    """A module whose forward (and backward) needs `units` gathered."""

    name: str
    """Its qualified name in the model ("" for the root)."""
    module: torch.nn.Module
    """The module whose hooks gather and free."""
    units: list[Unit] = field(default_factory=list)
    """The units owning the parameters of its scope, in unit order."""
    calls: list = field(default_factory=list)
    """Its forward calls whose backward hooks are not registered yet (a stack: pre-forward pushes)."""


def scopes(model: torch.nn.Module, unit_modules: Sequence[torch.nn.Module]) -> list[tuple[str, list]]:
    """(name, parameters of its scope) of each unit module, in module order; the root must be among them."""
    order = {id(m): i for i, m in enumerate(model.modules())}
    unit_modules = sorted(unit_modules, key=lambda m: order.get(id(m), -1))  # module order: the first owns
    chosen = {id(m) for m in unit_modules}
    if id(model) not in chosen:
        raise UsageError("the units must include the model itself (the root holds what no other unit does)")
    names = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
    result = []
    for module in unit_modules:
        if id(module) not in order:
            raise UsageError(f"unit {type(module).__name__} is not a submodule of the model")
        params, seen, stack = [], set(), [module]
        while stack:  # depth first in registration order, stopping at nested unit modules
            current = stack.pop()
            for param in current.parameters(recurse=False):
                if id(param) not in seen:
                    seen.add(id(param))
                    params.append(param)
            stack.extend(reversed([c for c in current.children() if id(c) not in chosen]))
        result.append((names[id(module)], params))
    return result


class Unit:
    """The parameters of one unit in one flat buffer, split element-balanced over the ranks.

    Args:
        name: the unit module's qualified name ("" for the root).
        params: its parameters, in buffer order.
        rank, world_size: this rank in the data-parallel group.
        dtype, device: of the buffers (the model's dtype; the communication device).
    """

    def __init__(self, name: str, params: list, *, rank: int, world_size: int, dtype, device):
        self.name, self.params, self.rank = name, params, rank
        self.index = 0  # its place among the model's units (Zero3Model sets it; message tags derive from it)
        self.partition: FlatPartition = flat_partition([p.numel() for p in params], world_size)
        self.start, self.stop = self.partition.rank_range(rank)
        self.shard = torch.zeros(self.partition.partition_size, dtype=dtype, device=device)
        self.flat = torch.empty(self.partition.total_size, dtype=dtype, device=device)
        self._bytes = self.flat.untyped_storage().nbytes()
        self.views = [  # each parameter's view, made while the buffer has its bytes (a view of 0 bytes cannot be)
            self.flat[offset : offset + p.numel()].view(p.shape)
            for p, offset in zip(params, self.partition.offsets, strict=True)
        ]
        self.grad: torch.Tensor | None = None
        self.pending = None  # the gather in flight
        self.gathered = False
        self.users = 0  # forward or backward calls of hook points using it now
        self.shared = False  # more than one hook point needs it: it stays gathered for the rest of a pass
        self.free()

    def fill_shard(self, values_of) -> None:
        """Copy this rank's piece of every parameter into the shard; `values_of(i)` gives parameter i whole."""
        for piece in self.partition.pieces(self.rank):
            self.shard[piece.within(self.start)].copy_(
                values_of(piece.index)
                .detach()
                .reshape(-1)[piece.tensor_offset : piece.tensor_offset + piece.length]
            )

    def begin_gather(self, gather) -> None:
        """Give the gathered buffer its bytes, put this rank's slice in place, start `gather(flat)` for the rest."""
        self._version = self.flat._version
        self.flat.untyped_storage().resize_(self._bytes)
        with torch.no_grad():
            self.flat[self.start : self.stop].copy_(self.shard)
        self.pending = gather(self.flat)
        self.gathered = True

    def finish_gather(self) -> None:
        """Wait for the gather in flight; then hide its writes from autograd (some land on the backend's own
        thread, e.g. gloo's all_gather_into_tensor copies its output there: the version moves when it does)."""
        if self.pending is not None:
            self.pending.wait()
            self.pending = None
            torch._C._autograd._unsafe_set_version_counter((self.flat,), (self._version,))

    def free(self) -> None:
        """Drop the gathered bytes (the parameters keep their shapes, not their values)."""
        self.flat.untyped_storage().resize_(0)
        self.gathered, self.pending = False, None

    @property
    def gathered_bytes(self) -> int:
        """Bytes the gathered buffer holds now (0 when freed)."""
        return self.flat.untyped_storage().nbytes()

    def trainable(self) -> list[int]:
        """Indices of its parameters that take gradients now."""
        return [i for i, p in enumerate(self.params) if p.requires_grad]
