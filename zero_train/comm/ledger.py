"""CommLedger: bytes this rank puts into torch.distributed collectives (DeepSpeed and DDP included).

What is measured: every collective issued through a ``ProcessGroup`` method from Python. The ledger
patches the methods of ``torch._C._distributed_c10d.ProcessGroup`` (allreduce, broadcast, reduce,
allgather, all_gather_single, reduce_scatter, reduce_scatter_single, their coalesced forms, send, recv),
so it sees ``torch.distributed.*`` calls, DeepSpeed's ``deepspeed.comm`` (which binds
``torch.distributed.all_gather_into_tensor`` / ``reduce_scatter_tensor`` at init: those still end in the
ProcessGroup methods) and ``ZeroRedundancyOptimizer``.

DDP's C++ reducer calls the C++ ProcessGroup directly, which no Python patch sees. While a ledger is
open, every ``DistributedDataParallel`` constructed gets torch's stock ``allreduce_hook`` as its comm
hook (same arithmetic as the built-in reducer: divide by world size, all-reduce the bucket), which
issues its all-reduce from Python, so DDP's bucket traffic is measured too.

Payload convention (the logical size of the collective, the unit of the ZeRO paper):
all_reduce = tensor bytes; reduce_scatter = full input bytes; all_gather = full output bytes;
broadcast/reduce = tensor bytes; send/recv = tensor bytes (so a point-to-point message counts in the
payload of both its ends). ``wire_bytes`` estimates what this rank actually sends: ring algorithms send
all_reduce 2(N-1)/N, reduce_scatter and all_gather (N-1)/N of the payload, except that gloo emulates
reduce_scatter as an all-reduce plus a chunk copy, so there it sends an all-reduce's 2(N-1)/N (measured
in docs/zero1.md: slower than gloo's all_reduce of the same buffer); a send counts its bytes, a recv none.
"""

from __future__ import annotations

import threading

import torch
from torch._C._distributed_c10d import ProcessGroup
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "send_recv")

# ProcessGroup method -> (collective, function(args) -> payload bytes)


def _bytes(tensors) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    return sum(_bytes(t) for t in tensors)


def _first(args):
    return _bytes(args[0])


def _second(args):
    return _bytes(args[1])


_METHODS = {
    "allreduce": ("all_reduce", _first),
    "allreduce_coalesced": ("all_reduce", _first),
    "broadcast": ("broadcast", _first),
    "reduce": ("reduce", _first),
    "allgather": ("all_gather", _first),
    "all_gather_single": ("all_gather", _first),
    "_allgather_base": ("all_gather", _first),
    "allgather_coalesced": ("all_gather", _first),
    "allgather_into_tensor_coalesced": ("all_gather", _first),
    "all_gather_single_coalesced": ("all_gather", _first),
    "reduce_scatter": ("reduce_scatter", _second),
    "reduce_scatter_single": ("reduce_scatter", _second),
    "_reduce_scatter_base": ("reduce_scatter", _second),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", _second),
    "reduce_scatter_single_coalesced": ("reduce_scatter", _second),
    "send": ("send_recv", _first),
    "recv": ("send_recv", _first),
}

_LOCK = threading.Lock()
_ACTIVE: list[CommLedger] = []
_ORIGINALS: dict[str, object] = {}


def _backend_name(process_group) -> str | None:
    try:
        return process_group.name()
    except (AttributeError, RuntimeError):
        return None


def _wrap(method_name: str, original):
    collective, payload = _METHODS[method_name]

    def counted(self, *args, **kwargs):
        if _ACTIVE:
            nbytes = payload(args)
            world = self.size()
            sent = (
                0.0 if method_name == "recv" else nbytes * wire_factor(collective, world, _backend_name(self))
            )
            for ledger in list(_ACTIVE):
                ledger._add(collective, nbytes, sent)
        return original(self, *args, **kwargs)

    return counted


def _install() -> None:

    for name in _METHODS:
        if name not in ProcessGroup.__dict__:
            continue
        _ORIGINALS[name] = ProcessGroup.__dict__[name]
        setattr(ProcessGroup, name, _wrap(name, getattr(ProcessGroup, name)))
    original_init = DistributedDataParallel.__init__
    _ORIGINALS["ddp_init"] = original_init

    def ddp_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)

        self.register_comm_hook(None, allreduce_hook)

    DistributedDataParallel.__init__ = ddp_init


def _uninstall() -> None:

    DistributedDataParallel.__init__ = _ORIGINALS.pop("ddp_init")
    for name, original in _ORIGINALS.items():
        setattr(ProcessGroup, name, original)
    _ORIGINALS.clear()


def wire_factor(collective: str, world_size: int, backend: str | None = None) -> float:
    """Bytes a rank sends on the wire per payload byte (ring algorithms; gloo's emulated reduce-scatter).

    Args:
        collective: a name in COLLECTIVES.
        world_size: ranks in the group.
        backend: the process group's backend ("gloo", "nccl", ...; None: an ideal ring).
    Returns:
        2(N-1)/N for all_reduce (and reduce_scatter on gloo, an all-reduce underneath), (N-1)/N for
        reduce_scatter/all_gather/broadcast/reduce, 1 for a send.
    """
    if world_size <= 1:
        return 0.0
    ring = (world_size - 1) / world_size
    if collective == "reduce_scatter" and backend == "gloo":
        return 2 * ring
    return {"all_reduce": 2 * ring, "send_recv": 1.0}.get(collective, ring)


def wire_from_payload(payload: dict[str, int], world_size: int, backend: str | None = None) -> dict[str, int]:
    """Estimated bytes sent, per collective plus "total", from payload totals (a run record's counts).

    The payload counts a point-to-point message at both ends (send and recv); the rings that use them
    send exactly what they receive, so half of the send_recv payload was sent.

    Args:
        payload: CommLedger.totals() (or a run record's comm_bytes_per_step).
        world_size: ranks in the group.
        backend: as in wire_factor.
    """
    wire = {
        key: int(payload.get(key, 0) * (0.5 if key == "send_recv" else wire_factor(key, world_size, backend)))
        for key in COLLECTIVES
    }
    wire["total"] = sum(wire.values())
    return wire


class CommLedger:
    """Context manager counting payload bytes per collective on this rank (nests; thread-safe install).

    Args:
        on_call: called as on_call(collective, payload_bytes) at every collective this ledger counts, as it
            is issued (zero_train.comm.step_counters splits them by section and times them against backward).
    """

    def __init__(self, *, on_call=None) -> None:
        self._payload = dict.fromkeys(COLLECTIVES, 0)
        self._wire = dict.fromkeys(COLLECTIVES, 0.0)
        self.calls = dict.fromkeys(COLLECTIVES, 0)
        self.on_call = on_call

    def __enter__(self) -> CommLedger:
        with _LOCK:
            if not _ACTIVE:
                _install()
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            if not _ACTIVE and _ORIGINALS:
                _uninstall()

    def _add(self, collective: str, nbytes: int, sent_bytes: float) -> None:
        self._payload[collective] += nbytes
        self._wire[collective] += sent_bytes
        self.calls[collective] += 1
        if self.on_call is not None:
            self.on_call(collective, nbytes)

    def reset(self) -> None:
        """Forget everything counted so far."""
        for key in COLLECTIVES:
            self._payload[key] = 0
            self._wire[key] = 0.0
            self.calls[key] = 0

    def totals(self) -> dict[str, int]:
        """Payload bytes per collective (the keys of COLLECTIVES) plus "total"."""
        result = {key: int(value) for key, value in self._payload.items()}
        result["total"] = sum(result.values())
        return result

    def wire_bytes(self) -> dict[str, int]:
        """Estimated bytes this rank sends on the wire (see wire_factor), per collective plus "total"."""
        result = {key: int(value) for key, value in self._wire.items()}
        result["total"] = sum(result.values())
        return result


def paper_volume_bytes(stage: int, num_params: int, bytes_per_element: int) -> int:
    """The ZeRO paper's per-step communication volume: 2 Psi for DDP/ZeRO-1/2, 3 Psi for ZeRO-3.

    Args:
        stage: ZeRO stage 0..3 (0 = DDP).
        num_params: Psi.
        bytes_per_element: bytes of the communicated dtype (4 fp32, 2 bf16/fp16).
    Returns:
        bytes.
    """
    return (3 if stage == 3 else 2) * num_params * bytes_per_element
