"""Build a model whose parameters never exist whole on this rank, with the values an unsharded build gives.

    with MetaBuild() as build:
        model = model_fn()                  # any code that builds and initialises a model (seeded)
    sharded = Zero3Model(model, values_of=build.values)   # each rank materialises only its pieces

Inside the context every parameter a module registers becomes a parameter on the meta device (no bytes), and
every operation that writes into one (nn.Linear's kaiming_uniform_, transformers' normal_ and zeros_, a row
zeroed for padding_idx) is recorded for that parameter, with the random generator's state when it draws random
numbers. The draws themselves still happen, into a scratch tensor of the same shape that is dropped at once,
so the generator advances exactly as in the unsharded build and everything after (buffers, the next
parameter, the training data's shuffling) sees the same random stream.

`values(param)` then replays one parameter's record on a CPU tensor: the generator is set to each recorded
state, the same operations run, and the generator is put back. The result is bit for bit the tensor the
unsharded build made (tests/sharding/test_zero3.py). Zero3Model asks for one parameter at a time and keeps only this
rank's piece, so the build holds at most one whole parameter besides the slices: about 1/N of the model.

What is recorded: writes into a parameter, through any view of it (an operation is matched to its parameter
by storage). A write that overwrites the whole parameter (fill, zero, uniform_, normal_, copy_ ...) drops what
was recorded before it. A parameter whose module created it with values (torch.ones) keeps them until such an
overwrite. Refused (UsageError): an operation that reads one parameter to write another (the build would need
both whole at once). Parameters a module did not register (a loaded checkpoint's tensors) stay as they are.
"""

from __future__ import annotations

import torch
from torch.nn.modules.module import register_module_parameter_registration_hook
from torch.utils._python_dispatch import TorchDispatchMode

from zero_train.runtime.errors import UsageError

aten = torch.ops.aten
OVERWRITES = {
    aten.fill_, aten.zero_, aten.uniform_, aten.normal_, aten.copy_, aten.random_,
    aten.bernoulli_, aten.exponential_, aten.geometric_, aten.log_normal_, aten.cauchy_,
}  # fmt: skip
"""In-place operations whose result does not depend on the tensor's previous values."""


class MetaBuild(TorchDispatchMode):
    """Context: parameters registered inside it are meta tensors with a replayable record of their values."""

    def __init__(self):
        super().__init__()
        self._roots: dict[int, torch.nn.Parameter] = {}  # storage address of a meta parameter -> parameter
        self._records: dict[int, list] = {}  # id(parameter) -> [(op, args, kwargs, generator, state)]
        self._initial: dict[int, torch.Tensor] = {}  # id(parameter) -> the values it was created with
        self._hook = None
        self._generators = {torch.default_generator}  # every generator a recorded operation drew from
        self._final_state: dict[torch.Generator, torch.Tensor] = {}

    def __enter__(self):
        self._hook = register_module_parameter_registration_hook(self._registered)
        return super().__enter__()

    def __exit__(self, *exc):
        self._hook.remove()
        self._final_state = {generator: generator.get_state() for generator in self._generators}
        return super().__exit__(*exc)

    def _registered(self, module, name, param):
        """Swap a parameter being registered for a meta one; remember the values it was created with."""
        if param is None or param.device.type == "meta":
            return None
        meta = torch.nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
        meta.__dict__.update(param.__dict__)
        self._roots[_storage_key(meta)] = meta
        self._records[id(meta)] = []
        self._initial[id(meta)] = param.detach()
        return meta

    def _root(self, tensor) -> torch.nn.Parameter | None:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta":
            return self._roots.get(_storage_key(tensor))
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        written = [t for t in _written(func, args, kwargs) if self._root(t) is not None]
        if not written:
            return func(*args, **kwargs)
        target, root = written[0], self._root(written[0])
        generator = _generator(func, args, kwargs)
        state = generator.get_state() if generator is not None else None
        if generator is not None:
            self._generators.add(generator)
        if func.overloadpacket in OVERWRITES and _covers(target, root) and not self._reads_target(func, args):
            self._records[id(root)] = []
            self._initial.pop(id(root), None)
        refs = [self._ref(a, root) for a in args], {k: self._ref(v, root) for k, v in kwargs.items()}
        self._records[id(root)].append((func, *refs, generator, state))
        if generator is not None:  # draw the same numbers the real parameter would have, into a scratch
            scratch = torch.empty_strided(target.size(), target.stride(), dtype=target.dtype)
            func(*[scratch if a is target else a for a in args], **kwargs)
        return func(*args, **kwargs)

    def _reads_target(self, func, args) -> bool:
        """copy_ from the parameter itself (or another view of it) is not an overwrite."""
        return func.overloadpacket is aten.copy_ and self._root(args[1]) is not None

    def _ref(self, value, root):
        if not isinstance(value, torch.Tensor):
            return ("value", value)
        owner = self._root(value)
        if owner is root:
            return ("view", tuple(value.size()), tuple(value.stride()), value.storage_offset())
        if value.device.type == "meta":
            raise UsageError(
                "building the model writes one parameter from another (a meta tensor); the zero3 engine "
                "builds parameters one at a time: initialise them independently, or load the weights instead"
            )
        return ("value", value.detach().clone())  # its values now, not when the parameter is replayed

    def values(self, param: torch.nn.Parameter) -> torch.Tensor:
        """The parameter's values as the unsharded build made them (a new CPU tensor; itself if not recorded)."""
        if id(param) not in self._records:
            return param
        initial = self._initial.get(id(param))
        real = initial.clone() if initial is not None else torch.empty(param.shape, dtype=param.dtype)
        for func, args, kwargs, generator, state in self._records[id(param)]:

            def real_of(ref):
                return real.as_strided(*ref[1:]) if ref[0] == "view" else ref[1]

            if generator is not None:
                generator.set_state(state)
            func(*map(real_of, args), **{k: real_of(v) for k, v in kwargs.items()})
        for generator, state in self._final_state.items():
            generator.set_state(state)
        return real


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The tensor arguments an operation writes into (its schema's mutable arguments)."""
    found = []
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = args[position] if position < len(args) else kwargs.get(argument.name)
            if isinstance(value, torch.Tensor):
                found.append(value)
    return found


def _generator(func, args, kwargs) -> torch.Generator | None:
    """The generator a random operation draws from (the default CPU one unless given); None if it draws none."""
    for position, argument in enumerate(func._schema.arguments):
        if "Generator" in str(argument.type):
            value = args[position] if position < len(args) else kwargs.get(argument.name)
            return value if value is not None else torch.default_generator
    return None


def _covers(tensor: torch.Tensor, root: torch.Tensor) -> bool:
    """True if `tensor` is the whole of `root` (same elements, contiguous, from its start)."""
    return tensor.storage_offset() == 0 and tensor.numel() == root.numel() and tensor.is_contiguous()
