"""Zero3Model: ZeRO stage 3 (the ZeRO paper's P_os+g+p) in plain torch.distributed.

Every parameter lives only as this rank's 1/N slice of its unit's flat buffer (units.py: a unit is a
transformer block, the embeddings, the head, or the root; a scope mixing frozen and trainable parameters, as
LoRA's base and adapters, is two units). A unit is all-gathered just before the forward of
a module that uses it and freed after; gathered again before that module's backward and freed after; its
gradients are reduce-scattered to their owners as soon as they are complete (grads.py). The next unit's
gather is launched while the current one computes, in the order the last pass ran the modules.

    sharded = Zero3Model(model)                               # shards the model in place
    optimizer = Zero3Optimizer(sharded, torch.optim.AdamW, lr=3e-4, weight_decay=0.1)
    for micro_batch in micro_batches:                         # the hooks gather, free and reduce-scatter
        (model(input_ids=micro_batch, labels=micro_batch).loss / len(micro_batches)).backward()
    optimizer.clip_grad_norm_(1.0)                            # one all-reduce of partial norms
    optimizer.step()                                          # this rank's slices only: nothing is gathered
    optimizer.zero_grad()

One block k, on one rank (time flows to the right):

    compute  ..block k-1..|wait k|[ forward of block k ]|free k|..block k+1..
    comm     ~~~ gather k ~~~>    ~~~ gather k+1 ~~~>                     (launched at k's pre-forward)
      ...
    compute  ..block k+1..|wait k|[ backward of block k ]|free k|..block k-1..
    comm     ~~~ gather k ~~~>    ~~~ gather k-1 ~~~>   ~~~ reduce-scatter k ~~~> (waited when k-1 launches;
                                                        its sum added into unit k's gradient slice)
    memory   unit k's slice (P) always; all of block k from its gather to its free; its whole gradients from
             backward until they are copied (divided by N) into the reduce-scatter's buffer

A unit that more than one module uses (a tied embedding: wte and lm_head) stays gathered from its first use
to the end of the pass (forward, or backward) instead of being gathered twice. So a step moves 3 Psi: one
gather in forward, one in backward, one reduce-scatter. Activation checkpointing's recomputation runs inside
backward, after the block's pre-backward gathered it: it finds the unit gathered.

Every rank must run the same modules in the same order (the collectives pair up by order), as with FSDP2 and
DeepSpeed. A parameter must be used inside the forward of a module of its scope (a unit module, or the root).
"""

from __future__ import annotations

import functools
import weakref

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding.comm.collectives import gather_slices
from zero_train.sharding.comm.groups import backend_name, group_rank_and_size
from zero_train.sharding.zero3.grads import GradientReducer
from zero_train.sharding.zero3.hooks import BackwardCall, in_backward, output_tensors, wrap_inputs
from zero_train.sharding.zero3.units import HookPoint, Unit, choose_unit_modules, scopes


class Zero3Model:
    """Shards `model` in place and gathers each unit around the forward and backward that use it.

    Args:
        model: a module whose parameters share one dtype; real (a normal model) or on the meta device
            (then `values_of` gives each parameter's values: meta_build.py).
        unit_modules: the modules to gather one at a time, the model itself included (default
            `choose_unit_modules`: decoder layers, embeddings, head, root).
        process_group: the data-parallel group (None: the default group).
        device: where the slices live (default: the parameters' device).
        dtype: the parameters' dtype once sharded (default: theirs); the values are cast to it.
        reduce_dtype: the dtype gradients are reduce-scattered in (default: the parameters'; a bf16 model may
            reduce in fp32, as FSDP2's default policy does).
        grad_dtype: the dtype the gradient slices accumulate the micro-batches in (default: reduce_dtype).
        values_of: parameter -> its full values, called once per parameter this rank holds a piece of
            (default: the parameter itself).
        prefetch: launch the next unit's gather while the current one computes.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        unit_modules=None,
        process_group=None,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
        grad_dtype: torch.dtype | None = None,
        values_of=None,
        prefetch: bool = True,
    ):
        self.model, self.process_group, self.prefetch = model, process_group, prefetch
        self.rank, self.world_size = group_rank_and_size(process_group)
        self.backend = backend_name(process_group)
        dtypes = {p.dtype for p in model.parameters()}
        if dtype is None and len(dtypes) != 1:
            raise UsageError(
                f"Zero3Model needs one parameter dtype, got {sorted(map(str, dtypes))}; cast the model or pass dtype"
            )
        self.dtype = dtype or dtypes.pop()
        self.device = device or next(model.parameters()).device
        self.points, self.units = self._build(
            unit_modules or choose_unit_modules(model), values_of or (lambda p: p)
        )
        self.root = next(point for point in self.points if point.module is model)
        self.owner = {id(p): unit for unit in self.units for p in unit.params}
        self.reducer = GradientReducer(self.units, process_group, self.world_size, reduce_dtype, grad_dtype)
        self._forward_trace: list[HookPoint] = []  # the last complete pass of each kind (prefetch order)
        self._backward_trace: list[HookPoint] = []
        self._trace: list[HookPoint] = []
        self._in_backward = False
        self._hooks: list = []
        self._grad_hooked: set[int] = set()
        self._register_hooks()

    # ---------------------------------------------------------------- building
    def _build(self, unit_modules, values_of) -> tuple[list[HookPoint], list[Unit]]:
        """Hook points and units; fill every slice, then make the parameters views of the gathered buffers."""
        owner: dict[int, Unit] = {}
        points, units = [], []
        modules = {name: module for name, module in self.model.named_modules(remove_duplicate=False)}
        for name, params in scopes(self.model, unit_modules):
            owned = [p for p in params if id(p) not in owner]
            for kept in _frozen_then_trainable(owned):
                unit = Unit(
                    name,
                    kept,
                    rank=self.rank,
                    world_size=self.world_size,
                    dtype=self.dtype,
                    device=self.device,
                )
                unit.index = len(units)
                units.append(unit)
                owner.update({id(p): unit for p in kept})
            needed = list(dict.fromkeys(owner[id(p)] for p in params))
            points.append(HookPoint(name, modules[name], sorted(needed, key=units.index)))
        for unit in units:
            unit.fill_shard(lambda index, unit=unit: values_of(unit.params[index]))
            for param, view in zip(unit.params, unit.views, strict=True):
                _become_view(param, view)
            unit.views = []
        users = [unit for point in points for unit in point.units]
        for unit in units:
            unit.shared = users.count(unit) > 1
        return points, units

    def _register_hooks(self) -> None:
        me = weakref.ref(self)  # the model's hooks must not keep the sharder (and its buffers) alive

        def call(method, *args):
            sharder = me()
            return None if sharder is None else method(sharder, *args)

        for point in self.points:
            pre, post = (
                functools.partial(call, m, point) for m in (Zero3Model._pre_forward, Zero3Model._post_forward)
            )
            self._hooks.append(point.module.register_forward_pre_hook(pre, prepend=True, with_kwargs=True))
            self._hooks.append(point.module.register_forward_hook(post))
        self._on_grad_hook = functools.partial(call, Zero3Model._on_grad)
        self._hook_new_trainable()

    def _hook_new_trainable(self) -> None:
        """A post-accumulate-grad hook on every parameter that takes gradients now (once each: unfrozen later too)."""
        for param in self.parameters():
            if param.requires_grad and id(param) not in self._grad_hooked:
                self._grad_hooked.add(id(param))
                self._hooks.append(param.register_post_accumulate_grad_hook(self._on_grad_hook))

    def parameters(self) -> list[torch.nn.Parameter]:
        """Every parameter, once, in unit order (the order of the flat buffers)."""
        return [p for unit in self.units for p in unit.params]

    # ------------------------------------------------------------- gathering
    def _launch_gather(self, unit: Unit) -> None:
        if unit.gathered:
            return
        tag = 2 * unit.index  # the reduce-scatters use odd tags
        unit.begin_gather(lambda flat: gather_slices(flat, self.process_group, tag=tag))

    def _acquire(self, units: list[Unit]) -> None:
        for unit in units:
            self._launch_gather(unit)
            unit.users += 1

    def _wait(self, units: list[Unit]) -> None:
        for unit in units:
            unit.finish_gather()

    def _release(self, units: list[Unit], *, free: bool) -> None:
        for unit in units:
            unit.users -= 1
            if free and unit.users == 0 and not unit.shared:
                self._free(unit)

    def _free(self, unit: Unit) -> None:
        self._wait([unit])  # never free a buffer a message is still landing in
        unit.free()

    def _free_unused(self) -> None:
        """Free every gathered unit no module is using (shared ones, prefetched ones nobody claimed)."""
        for unit in self.units:
            if unit.gathered and unit.users == 0:
                self._free(unit)

    def _prefetch_next(self, predicted: list[HookPoint]) -> None:
        """Launch the gathers of the call that followed this one in the last pass of the same kind."""
        position = len(self._trace) - 1
        if self.prefetch and position + 1 < len(predicted) and predicted[position] is self._trace[-1]:
            for unit in predicted[position + 1].units:
                self._launch_gather(unit)

    # ---------------------------------------------------------------- forward
    def _pre_forward(self, point: HookPoint, module, args, kwargs):
        if in_backward():  # activation checkpointing recomputes inside backward: the unit is gathered
            self._acquire(point.units)
            self._wait(point.units)
            return None
        if point is self.root:
            self._start_forward()
        self._trace.append(point)
        self._acquire(point.units)
        self._prefetch_next(self._forward_trace)
        self._wait(point.units)
        if not torch.is_grad_enabled():
            return None
        call = BackwardCall(point)
        point.calls.append(call)
        return wrap_inputs(args, kwargs, functools.partial(self._post_backward, call))

    def _start_forward(self) -> None:
        """A new pass: nothing is in use between passes (after a pass that raised, its units are let go here)."""
        self._trace = []
        for unit in self.units:
            unit.users = 0
        for point in self.points:
            point.calls = []
        self._free_unused()
        self._hook_new_trainable()

    def _post_forward(self, point: HookPoint, module, args, output):
        if in_backward():
            self._release(point.units, free=False)
            return None
        self._release(point.units, free=True)
        if torch.is_grad_enabled() and point.calls:
            call = point.calls.pop()
            for tensor in output_tensors(output):
                tensor.register_hook(functools.partial(self._pre_backward, call))
        if point is self.root:
            self._forward_trace = self._trace
            self.reducer.set_order([unit for p in self._trace for unit in p.units])
            self._free_unused()
        return None

    # --------------------------------------------------------------- backward
    def _start_backward(self) -> None:
        if self._in_backward:
            return
        self._in_backward = True
        self._trace = []
        me = weakref.ref(self)
        torch.autograd.Variable._execution_engine.queue_callback(
            lambda: me() is not None and me()._end_backward()
        )

    def _pre_backward(self, call: BackwardCall, grad):
        """The first gradient of a forward call's outputs: gather its units before its backward runs."""
        if call.acquired:
            return grad
        self._start_backward()
        call.acquired = True
        self._trace.append(call.point)
        self._acquire(call.point.units)
        self._prefetch_next(self._backward_trace or self._first_backward_guess())
        self._wait(call.point.units)
        return grad

    def _first_backward_guess(self) -> list[HookPoint]:
        """Before any backward ran: the root first (the loss is its output), then the forward reversed."""
        return [self.root, *(point for point in reversed(self._forward_trace) if point is not self.root)]

    def _post_backward(self, call: BackwardCall) -> None:
        """The gradients of a forward call's inputs are computed: its backward is done, free its units."""
        if call.acquired and not call.released:
            call.released = True
            self._release(call.point.units, free=True)

    def _on_grad(self, param: torch.Tensor) -> None:
        if param.grad is None:
            return
        self._start_backward()
        self.reducer.arrived(self.owner[id(param)], param)

    def _end_backward(self) -> None:
        """Launch and wait for the reductions left, free every unit, keep this backward's order for the next."""
        self.reducer.finish()
        for unit in self.units:
            unit.users = 0
        self._free_unused()
        for point in self.points:
            point.calls = []
        self._backward_trace = self._trace
        self._trace = []
        self._in_backward = False

    # -------------------------------------------------------------- accounting
    def gathered_bytes(self) -> int:
        """Bytes of gathered buffers alive now (0 between steps)."""
        return sum(unit.gathered_bytes for unit in self.units)

    def remove_hooks(self) -> None:
        """Detach every hook (the parameters stay sharded)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []


def _frozen_then_trainable(params: list) -> list[list]:
    """A scope's parameters as one unit, or two when it mixes frozen and trainable ones (LoRA's base and
    adapters): the frozen unit never reduces gradients nor holds masters, and the trainable one's slices,
    gradients and optimizer state are 1/N of the adapters alone."""
    frozen = [p for p in params if not p.requires_grad]
    trainable = [p for p in params if p.requires_grad]
    return [kept for kept in (frozen, trainable) if kept]


def _become_view(param: torch.nn.Parameter, view: torch.Tensor) -> None:
    """Make `param` (real or meta) a view of `view`'s storage, keeping the object (tied references, attributes)."""
    replacement = torch.nn.Parameter(view, requires_grad=param.requires_grad)
    replacement.__dict__.update(param.__dict__)
    torch.utils.swap_tensors(param, replacement)
