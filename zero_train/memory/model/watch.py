"""The two instruments that count activations (see ``activations``): saved-tensor hooks and live bytes.

- ``Counter`` runs one forward and backward of a model and records, through
  torch.autograd.graph.saved_tensors_hooks, every storage autograd saves (each once, parameters and buffers
  left out), per transformer block too.
- ``LiveBytes`` is a TorchDispatchMode that sees every storage an op creates and is told when each dies:
  the live bytes after every op, so the forward's, the loss's and the backward's highest points.
- ``OpCost`` is a TorchDispatchMode on the same pass that adds up what the ops cost (the step-time model's
  compute, zero_train.timing): matmul and attention FLOPs (torch's FLOP counter formulas) per phase, the FLOPs
  of blocks run again in backward under checkpointing, and the bytes the other ops read and write.

Both work the same on fake tensors (no memory) and on real ones; a storage is identified by its StorageImpl
(``storage_key``), which views, fake tensors and real tensors all have.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count


def storage_key(tensor: torch.Tensor) -> tuple[int, int]:
    """(identity, bytes) of a tensor's storage: views share it, fake tensors have one too."""
    storage = tensor.untyped_storage()
    return storage._cdata, storage.nbytes()  # the StorageImpl's address, as StorageWeakRef(storage).cdata


@dataclass
class Counter:
    """Runs one forward and backward of a model and watches what it saves and what is alive."""

    model: torch.nn.Module
    blocks: list
    saved: dict[int, int] = field(default_factory=dict)
    saved_by_block: dict[int, int] = field(default_factory=dict)
    input_by_block: dict[int, int] = field(default_factory=dict)
    current_block: int | None = None
    forward_peak: int = 0
    loss_peak: int = 0
    backward_peak: int = 0
    cost: OpCost = field(default_factory=lambda: OpCost())

    def __post_init__(self) -> None:
        state = [*self.model.parameters(), *self.model.buffers()]
        self.excluded = {storage_key(tensor)[0] for tensor in state}

    @property
    def saved_bytes(self) -> int:
        return sum(self.saved.values())

    def largest_block(self) -> tuple[int, int]:
        """(saved bytes, input bytes) of the block saving the most."""
        if not self.saved_by_block:
            return 0, 0
        index = max(self.saved_by_block, key=lambda i: (self.saved_by_block[i], -i))
        return self.saved_by_block[index], self.input_by_block.get(index, 0)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key, nbytes = storage_key(tensor)
        if key not in self.excluded and key not in self.saved:
            self.saved[key] = nbytes
            if self.current_block is not None:
                self.saved_by_block[self.current_block] = (
                    self.saved_by_block.get(self.current_block, 0) + nbytes
                )
        return tensor

    @contextlib.contextmanager
    def saved_hooks(self):
        handles = [
            handle
            for index, block in enumerate(self.blocks)
            for handle in (
                block.register_forward_pre_hook(
                    functools.partial(self._enter_block, index), with_kwargs=True
                ),
                block.register_forward_hook(self._leave_block),
            )
        ]
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor):
                yield
        finally:
            for handle in handles:
                handle.remove()

    def _enter_block(self, index: int, module, args, kwargs) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if self.current_block is None and torch.is_grad_enabled() and isinstance(hidden, torch.Tensor):
            self.current_block = index
            self.input_by_block[index] = storage_key(hidden)[1]

    def _leave_block(self, module, args, output) -> None:
        self.current_block = None

    def run(self, ids: torch.Tensor) -> None:
        """Forward (saved-tensor hooks, live bytes, op costs) and backward (live bytes, op costs, gradients
        dropped at once)."""
        head = self.model.get_output_embeddings()
        live = LiveBytes(excluded={*self.excluded, storage_key(ids)[0]})
        handle = head.register_forward_pre_hook(lambda *_: live.mark("loss"))
        grads = [
            p.register_post_accumulate_grad_hook(live.drop_grad)
            for p in self.model.parameters()
            if p.requires_grad
        ]
        try:
            with live, self.cost:
                with self.saved_hooks():
                    loss = self.model(input_ids=ids, labels=ids).loss
                live.mark("backward")
                self.cost.phase = "backward"
                loss.backward()
                del loss
        finally:
            handle.remove()
            for hook in grads:
                hook.remove()
        self.forward_peak = live.peak(until="backward")
        self.loss_peak = live.peak(start="loss", until="backward")
        self.backward_peak = live.peak(start="backward")


class LiveBytes(TorchDispatchMode):
    """Every storage an op creates (birth) and when it died (death), in op counts.

    A storage freed during or after op `clock` is dead before the next op's outputs exist: death clock + 1.
    Deaths come from a weakref callback on the storage's Python object (torch keeps that object as long as
    the StorageImpl lives), so each op costs O(its outputs), not O(live storages) (docs/memory_model.md#cost).
    Parameters' gradients are set apart (drop_grad) and left out of every peak.
    """

    def __init__(self, *, excluded: set[int]) -> None:
        super().__init__()
        self.excluded = excluded  # parameters, buffers, the input: alive before and after
        self.clock = 0
        self.alive: dict[int, tuple[weakref.ref, int, int]] = {}  # key -> (ref, bytes, birth)
        self.lives: list[tuple[int, int, int, int]] = []  # (key, bytes, birth, death)
        self.grads: set[tuple[int, int]] = set()  # (key, birth): storage addresses are reused after a free
        self.marks: dict[str, int] = {}
        self.open = True  # deaths after __exit__ count as alive at the end, as in `peak`

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, self.clock)

    def drop_grad(self, param: torch.Tensor) -> None:
        """Post-accumulate hook: a parameter's gradient is a model state; free it now and leave it out."""
        key = storage_key(param.grad)[0]
        if key in self.alive:
            self.grads.add((key, self.alive[key][2]))
        param.grad = None

    def _died(self, key: int, ref: weakref.ref) -> None:
        entry = self.alive.get(key)
        if self.open and entry is not None and entry[0] is ref:
            del self.alive[key]
            self.lives.append((key, entry[1], entry[2], self.clock + 1))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.clock += 1
        out = func(*args, **(kwargs or {}))
        for tensor in (out,) if isinstance(out, torch.Tensor) else tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                key = storage._cdata
                if key not in self.alive and key not in self.excluded:
                    nbytes = storage.nbytes()
                    if nbytes:
                        ref = weakref.ref(storage, functools.partial(self._died, key))
                        self.alive[key] = (ref, nbytes, self.clock)
        return out

    def __exit__(self, *exc):
        self.open = False
        return super().__exit__(*exc)

    def peak(self, *, start: str | None = None, until: str | None = None) -> int:
        """The most bytes alive after any op in [mark `start`, mark `until`), gradients left out."""
        low = self.marks.get(start, -1) if start else -1
        high = self.marks.get(until, self.clock + 1) if until else self.clock + 1
        ending = [(key, n, birth, self.clock + 1) for key, (_, n, birth) in self.alive.items()]
        deltas: dict[int, int] = {}
        for key, nbytes, birth, death in [*self.lives, *ending]:
            if (key, birth) in self.grads:
                continue
            deltas[birth] = deltas.get(birth, 0) + nbytes
            deltas[death] = deltas.get(death, 0) - nbytes
        level, best = 0, 0
        for clock in sorted(deltas):
            level += deltas[clock]
            if low < clock <= high:
                best = max(best, level)
        return best


def _cpu_attention_flops():
    """FLOP formulas for CPU's fused attention (torch's counter has the CUDA kernels' only): the same
    counts, two batched matmuls forward and four backward, as for the flash kernels."""

    def forward(query, key, value, *args, **kwargs) -> int:
        return sdpa_flop_count(query.shape, key.shape, value.shape)

    def backward(grad_out, query, key, value, *args, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)

    aten = torch.ops.aten
    return {
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
    }


class OpCost(TorchDispatchMode):
    """What one forward and backward's ops cost: FLOPs of matmuls and attention, bytes of everything else.

    FLOPs follow torch.utils.flop_counter's formulas (2 per multiply-add; attention's two matmuls counted in
    full, causal or not, as the counter and MFU conventions count them). An op without a formula is counted as
    the bytes it reads and writes (elementwise, norms, softmax, the loss, copies: bound by memory bandwidth);
    views move nothing and are left out. FLOPs of ops run with grad mode on while the backward runs are the
    recomputation of checkpointing (`recompute_flops`, also in `backward_flops`): autograd's own backward ops run
    with it off (no create_graph), checkpoint's re-run of a block's forward with it on. `ops`: every op
    dispatched, views included (each costs the eager dispatcher its own host time, whatever its size).
    """

    def __init__(self) -> None:
        super().__init__()

        self.formulas = dict(flop_registry)
        self.attention = {packet for packet in self.formulas if "attention" in str(packet)}
        self.shapes_given = set(_cpu_attention_flops())  # these take the tensors, the registry's their shapes
        for packet, formula in _cpu_attention_flops().items():
            self.formulas[packet] = formula
            self.attention.add(packet)
        self.phase = "forward"
        self.flops = {"forward": 0, "backward": 0}
        self.attention_flops = 0
        self.recompute_flops = 0
        self.memory_bytes = 0
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops += func.namespace != "prim"  # prim.device: fake tensors' device queries, not the model's ops
        packet = func._overloadpacket
        formula = self.formulas.get(packet)
        if formula is not None:
            flops = self._flops(packet, formula, out, args, kwargs)
            self.flops[self.phase] += flops
            self.attention_flops += flops if packet in self.attention else 0
            self.recompute_flops += flops if self.phase == "backward" and torch.is_grad_enabled() else 0
        else:
            self.memory_bytes += self._bytes(func, packet, args, kwargs, out)
        return out

    @staticmethod
    def _bytes(func, packet, args, kwargs, out) -> int:
        """Bytes an op reads and writes; 0 for queries (no tensor out) and views (out aliases an input)."""
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outs:
            return 0
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not func._schema.is_mutable:
            inputs = {tensor.untyped_storage()._cdata for tensor in ins}
            if any(tensor.untyped_storage()._cdata in inputs for tensor in outs):
                return 0
        written = sum(tensor.numel() * tensor.element_size() for tensor in outs)
        if packet is torch.ops.aten.embedding:  # reads the rows it writes, not the whole table
            return 2 * written
        return written + sum(tensor.numel() * tensor.element_size() for tensor in ins)

    def _flops(self, packet, formula, out, args, kwargs) -> int:
        if packet in self.shapes_given:
            return formula(*args, **kwargs)
        return formula(*args, **kwargs, out_val=out)
