"""HostSyncCounter: the operations that make the host wait for a CUDA device, counted on any device.

    counter = HostSyncCounter(dist_info.device)
    counter.start()                                 # a TorchFunctionMode: sees every torch call from Python
    with counter.section("engine"): engine.forward_backward(batch)
    loss = losses.tolist()                          # counted in the default section, "loop"
    counter.stop()
    counter.counts                                  # {"engine": 0, "loop": 1}

What counts as a host sync (each blocks the host until the device has run everything queued before it):
reading a device tensor's value (`.item()`, `.tolist()`, `bool()`/`float()`/`int()`, `.numpy()`, printing
it), copying it to the host (`.cpu()`, a blocking `copy_`), a blocking host-to-device copy (`.to(device)` or
`copy_` without `non_blocking=True`, `torch.tensor(data, device=...)`), an output whose size depends on the
values (`nonzero`, `masked_select`, `unique`, boolean-mask indexing, `repeat_interleave` by a tensor), an
explicit synchronize (torch.cuda, torch.accelerator, DeepSpeed's accelerator, synchronize below) and
`torch.distributed.barrier`.

Which tensors are device tensors: on CUDA, those on a CUDA device (exact). On CPU every tensor is a CPU
tensor, so the counter decides as a GPU run would have placed them: a tensor is a device tensor unless it
is HOST-TAGGED, and host tags follow provenance while the counter is on: a tensor made without a device
(`torch.zeros(3)`, `torch.tensor([...])`, torch's CPU step counters in its optimizers), `.cpu()`'s result,
what `host_work()` makes (the data pipeline), and what an op computes from host tensors only. Tensors
made before the counter started (the model, the engine's buffers) and those made for a device argument are
device tensors (on CPU, DeepSpeed's accelerator names the device "cpu"). Limits of the CPU emulation: an
explicit `device="cpu"` or `.to("cpu")` meant as the host is taken for the device (torch's optimizers' host
scalars are recognised); C++ code that syncs internally (without a Python-level call) is not seen on either
device.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import os
import sys

import torch
from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
from torch.autograd.graph import _engine_run_backward
from torch.optim.optimizer import _get_value
from torch.overrides import TorchFunctionMode

HOST_TAG = "_zero_train_host"
_Tensor = torch.Tensor

# reading a value of (the first tensor argument): a sync when that tensor is on the device
_READS = {
    _Tensor.item,
    _Tensor.tolist,
    _Tensor.__bool__,
    _Tensor.__float__,
    _Tensor.__int__,
    _Tensor.__index__,
    _Tensor.__complex__,
    _Tensor.__format__,
    _Tensor.__repr__,
    _Tensor.numpy,
    _Tensor.__array__,
    _Tensor.__contains__,
    _Tensor.__reduce_ex__,
    _Tensor.is_nonzero,
    torch.is_nonzero,
    _Tensor.nonzero,
    torch.nonzero,
    _Tensor.argwhere,
    torch.argwhere,
    _Tensor.masked_select,
    torch.masked_select,
    _Tensor.unique,
    torch.unique,
    _Tensor.unique_consecutive,
    torch.unique_consecutive,
    _Tensor.equal,
    torch.equal,
    _Tensor.allclose,
    torch.allclose,
}
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}  # host data copied to `device`, blocking
_BACKWARD = {_Tensor.backward, torch.autograd.backward}
_TENSOR_BACKWARD = inspect.signature(_Tensor.backward)
_AUTOGRAD_BACKWARD = inspect.signature(torch.autograd.backward)
_SKIP_FILES = (os.sep + "overrides.py", os.sep + "_tensor.py", __file__)
_OPTIMIZER_STEP_VALUE = _get_value.__code__
_ACTIVE: list[HostSyncCounter] = []


class HostSyncCounter(TorchFunctionMode):
    """Counts host syncs by section ("loop" unless inside `section(name)`), with where they came from.

    Args:
        device: the run's device (a CUDA device: exact; CPU: emulated, see the module docstring).
        on_backward: called with the root tensors of each backward pass, returns a context manager that
            the pass runs inside (the overlap schedule hooks its graph), or None.
    """

    def __init__(self, device: torch.device, *, on_backward=None) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.exact = self.device.type == "cuda"
        self.on_backward = on_backward
        self.current = "loop"
        self.counts: collections.Counter[str] = collections.Counter()
        self.sites: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self._host_work = 0
        self._patches: list[tuple[object, str, object]] = []

    @contextlib.contextmanager
    def section(self, name: str):
        """Count the syncs inside into `name` (sections nest; the innermost wins)."""
        outer, self.current = self.current, name
        try:
            yield
        finally:
            self.current = outer

    @contextlib.contextmanager
    def host_work(self):
        """Work a GPU run does on the host (the data pipeline): nothing counts, every tensor made is a host
        tensor (CPU emulation only; on CUDA the device decides)."""
        self._host_work += 1
        try:
            yield
        finally:
            self._host_work -= 1

    def reset(self) -> None:
        """Forget the counts and sites (the tags stay)."""
        self.counts.clear()
        self.sites.clear()

    def note(self, what: str, *, upload: bool = False) -> None:
        """Count one host sync in the current section (`what` names the operation; `upload`: host data
        copied to the device)."""
        if self._host_work:
            return
        frame = _caller_frame()
        if not self.exact and frame is not None and _torch_optimizer_host_work(frame, upload):
            return
        self.counts[self.current] += 1
        self.sites[self.current][f"{what} at {_site(frame)}"] += 1

    def is_device(self, tensor) -> bool:
        """Whether `tensor` lives on the device (as a GPU run would place it)."""
        if self.exact:
            return tensor.device.type == "cuda"
        return not getattr(tensor, HOST_TAG, False)

    def start(self) -> None:
        """Start counting (the mode pushed, the explicit synchronizations wrapped)."""
        self._patch_explicit_syncs()
        _ACTIVE.append(self)
        self.__enter__()

    def stop(self) -> None:
        """Stop counting; the counts stay."""
        self.__exit__(None, None, None)
        _ACTIVE.remove(self)
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches.clear()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _BACKWARD:
            return self._backward(func, args, kwargs)
        if func in _READS:
            if _first_tensor(args, kwargs) is not None and self.is_device(_first_tensor(args, kwargs)):
                self.note(_name(func))
        elif func is _Tensor.__getitem__ or func is _Tensor.__setitem__:
            self._indexing(func, args)
        elif func is torch.repeat_interleave or func is _Tensor.repeat_interleave:
            if isinstance(args[1] if len(args) > 1 else kwargs.get("repeats"), _Tensor):
                if "output_size" not in kwargs and self.is_device(args[0]):
                    self.note("repeat_interleave")
        elif func is _Tensor.to or func is _Tensor.cuda or func is _Tensor.cpu:
            return self._move(func, args, kwargs)
        elif func is _Tensor.copy_:
            self._copy(args, kwargs)
        elif func in _FROM_DATA and kwargs.get("device") is not None:
            data = args[0] if args else kwargs.get("data")
            empty = isinstance(data, (list, tuple)) and not data  # nothing to copy
            if not isinstance(data, _Tensor) and not empty and self._targets_device(kwargs["device"]):
                self.note(_name(func), upload=True)
        result = func(*args, **kwargs)
        if not self.exact:
            self._propagate(result, args, kwargs)
        return result

    def _indexing(self, func, args) -> None:
        index = args[1] if len(args) > 1 else None
        parts = index if isinstance(index, tuple) else (index,)
        masked = any(isinstance(p, _Tensor) and p.dtype in (torch.bool, torch.uint8) for p in parts)
        scalar_fill = func is _Tensor.__setitem__ and not isinstance(args[2], _Tensor)  # a masked_fill_
        if masked and not scalar_fill and self.is_device(args[0]):
            self.note("boolean-mask indexing")

    def _targets_device(self, device) -> bool:
        """Whether a `device=` argument names the device (on CPU every device argument does)."""
        return torch.device(device).type == "cuda" if self.exact else True

    def _move(self, func, args, kwargs):
        source = args[0]
        if func is _Tensor.cpu:
            target, non_blocking = torch.device("cpu"), False
        elif func is _Tensor.cuda:
            target, non_blocking = self.device, bool(kwargs.get("non_blocking", False))
        else:
            parse_kwargs = {k: v for k, v in kwargs.items() if k != "copy"}
            target, _, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **parse_kwargs)
        result = func(*args, **kwargs)
        if target is None:  # a dtype cast stays where it is
            if not self.exact and getattr(source, HOST_TAG, False) and result is not source:
                setattr(result, HOST_TAG, True)
            return result
        to_host = func is _Tensor.cpu or (self.exact and target.type == "cpu")
        if to_host:
            if self.is_device(source):
                self.note(_name(func))  # a device-to-host copy, blocking
            if not self.exact:
                result = _distinct(result, source)
                setattr(result, HOST_TAG, True)
            return result
        if not self.is_device(source) and not non_blocking and self._targets_device(target):
            self.note(f"{_name(func)} (blocking host-to-device copy)")
        if not self.exact and getattr(source, HOST_TAG, False):
            result = _distinct(result, source)  # the device copy of a host tensor: untagged
        return result

    def _copy(self, args, kwargs) -> None:
        destination, source = args[0], args[1] if len(args) > 1 else kwargs.get("src")
        non_blocking = (args[2] if len(args) > 2 else kwargs.get("non_blocking", False)) is True
        if not isinstance(source, _Tensor) or non_blocking:
            return
        if self.is_device(destination) != self.is_device(source):
            self.note("copy_ between host and device, blocking")

    def _propagate(self, result, args, kwargs) -> None:
        """Host-tag what an op makes from host tensors only, or a factory makes without a device."""
        if self._host_work:
            host = True
        else:
            inputs = _tensors(args, kwargs)
            host = kwargs.get("device") is None and all(getattr(t, HOST_TAG, False) for t in inputs)
        if not host:
            return
        outputs = result if isinstance(result, (tuple, list)) else (result,)
        for output in outputs:
            if isinstance(output, _Tensor) and not isinstance(output, torch.nn.Parameter):
                setattr(output, HOST_TAG, True)

    def _backward(self, func, args, kwargs):
        """Run backward with this mode pushed again, so that the hooks it runs are counted too."""
        if func is _Tensor.backward:
            bound = _TENSOR_BACKWARD.bind(*args, **kwargs)
            bound.apply_defaults()
            values = bound.arguments
            tensors, gradients = (values["self"],), values["gradient"]
        else:
            bound = _AUTOGRAD_BACKWARD.bind(*args, **kwargs)
            bound.apply_defaults()
            values = bound.arguments
            tensors = _tensor_or_tensors_to_tuple(values["tensors"], None)
            gradients = values["grad_tensors"]
        inputs = values.get("inputs")
        inputs = (inputs,) if isinstance(inputs, _Tensor) else tuple(inputs or ())
        grads = _make_grads(
            tensors, _tensor_or_tensors_to_tuple(gradients, len(tensors)), is_grads_batched=False
        )
        retain = values["create_graph"] if values["retain_graph"] is None else values["retain_graph"]
        observing = self.on_backward(tensors) if self.on_backward is not None else contextlib.nullcontext()
        with observing, self:
            _engine_run_backward(
                tensors,
                grads,
                retain,
                values["create_graph"],
                inputs,
                allow_unreachable=True,
                accumulate_grad=True,
            )

    def _patch_explicit_syncs(self) -> None:
        """Count the explicit synchronizations and torch.distributed.barrier while the counter is on."""
        targets = [
            (torch.cuda, "synchronize"),
            (torch.cuda.Stream, "synchronize"),
            (torch.cuda.Event, "synchronize"),
        ]
        if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "synchronize"):
            targets.append((torch.accelerator, "synchronize"))
        if torch.distributed.is_available():
            targets.append((torch.distributed, "barrier"))
        accelerators = sys.modules.get("deepspeed.accelerator.real_accelerator")
        accelerator = getattr(accelerators, "ds_accelerator", None)  # DeepSpeed's, once it chose one
        if accelerator is not None:
            targets.append((type(accelerator), "synchronize"))
        for owner, name in targets:
            original = getattr(owner, name)
            self._patches.append((owner, name, original))
            setattr(owner, name, self._counting(original, f"{getattr(owner, '__name__', owner)}.{name}"))

    def _counting(self, original, what: str):
        def counted(*args, **kwargs):
            self.note(what)
            return original(*args, **kwargs)

        return counted


def synchronize(device: torch.device | str) -> None:
    """Wait until every kernel queued on `device` has finished (CUDA); nothing to wait for on CPU.

    CUDA kernels run asynchronously: a wall-clock timing is only right if the queue is empty at both ends.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    else:  # a CPU run counts it as the CUDA run's sync it stands for
        note_emulated_synchronize()


def note_emulated_synchronize() -> None:
    """synchronize on a CPU run: what a CUDA run's synchronize would be."""
    for counter in _ACTIVE:
        if not counter.exact:
            counter.note("synchronize")


def _torch_optimizer_host_work(frame, upload: bool) -> bool:
    """torch's optimizers (not capturable, not fused) keep `step` on the host: reading it (`_get_value`) and
    making their scalar `torch.tensor(1.0, device="cpu")` wait for nothing on a GPU."""
    if frame.f_code is _OPTIMIZER_STEP_VALUE:
        return True
    return upload and (os.sep + "torch" + os.sep + "optim" + os.sep) in frame.f_code.co_filename


def _distinct(result, source):
    """`result` as its own tensor object when an op returned its input unchanged (so tags can differ)."""
    return result.view_as(result) if result is source else result


def _first_tensor(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, _Tensor):
            return value
    return None


def _tensors(args, kwargs) -> list:
    found = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, _Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, _Tensor))
    return found


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


def _caller_frame():
    """The innermost frame outside torch's dispatch and this module."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.endswith(_SKIP_FILES):
        frame = frame.f_back
    return frame


def _site(frame) -> str:
    """file:line (function) of a frame, the path from the package on."""
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    short = path.split("site-packages" + os.sep)[-1].split(os.sep + "zero_train" + os.sep)[-1]
    return f"{short}:{frame.f_lineno} ({frame.f_code.co_name})"
