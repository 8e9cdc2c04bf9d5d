"""An engine's collectives on one set-up: calls, bytes and seconds of each (the registry's `collectives`).

The payload is the CommLedger's unit (an all-reduce its tensor, an all-gather its output, a reduce-scatter its
input). On a link given by bus bandwidth (GPU presets) a call of B bytes over N ranks takes
latency + hops x hop latency + factor x B / bus bandwidth, with the ring's factor 2(N-1)/N for an all-reduce and
(N-1)/N for a reduce-scatter or an all-gather (a broadcast: 1), as nccl-tests define bus bandwidth. A calibrated
machine's measured collectives replace the formula: latency + B / measured payload rate, at the nearest world size
measured (scaled by the ring factor when it differs). A bucketed reduction's calls are its buckets, each a run of
whole tensors up to the bucket size, a larger tensor alone (sharding.comm.buckets.bucket_groups: our ZeRO-1/2's
cut; DeepSpeed's ZeRO-1/2 cut alike).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zero_train.registry import DEEPSPEED, Collective, EngineSpec
from zero_train.sharding.comm.buckets import bucket_groups
from zero_train.timing import constants
from zero_train.timing.machine import Machine, Measured, ring_hops


@dataclass(frozen=True, kw_only=True, slots=True)
class CommSetup:
    """What decides an engine's calls and bytes."""

    world_size: int
    gpus_per_node: int
    precision: str
    num_params: int
    trainable_params: int
    num_tensors: int
    """Trainable parameter tensors (a broadcast per tensor)."""
    units: int
    """Modules gathered one at a time (ZeRO-3, FSDP2): the blocks, the embedding, the head."""
    bucket_elements: int
    """The config's reduce_bucket_size."""
    tensor_numels: tuple[int, ...] = ()
    """Elements of every trainable tensor, in the model's order (buckets hold whole tensors); (): unknown."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CommCall:
    """One collective of the step, costed for one occurrence (one micro-step or the step)."""

    collective: Collective
    payload_bytes: int
    calls: int
    seconds: float

    @property
    def name(self) -> str:
        """E.g. "reduce_scatter grads (backward)"."""
        return f"{self.collective.op} {self.collective.of} ({self.collective.phase})"


def ring_factor(op: str, world_size: int) -> float:
    """Bytes a rank sends per payload byte in a ring (nccl-tests' bus bandwidth factor)."""
    if world_size <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (world_size - 1) / world_size
    if op == "broadcast":
        return 1.0
    return (world_size - 1) / world_size


def payload_bytes(collective: Collective, setup: CommSetup) -> int:
    """The bytes one occurrence moves (the ledger's payload)."""
    element = 4 if setup.precision == "fp32" else 2
    sizes = {
        "grads": setup.trainable_params * element,
        "grads_fp32": setup.trainable_params * 4,
        "params": setup.num_params * element,
        "masters": setup.trainable_params * 4,
    }
    return sizes[collective.of]


def call_count(collective: Collective, setup: CommSetup, payload: int) -> int:
    """Calls per occurrence."""
    element = 4 if setup.precision == "fp32" else 2
    per = collective.per
    if per == "ddp_bucket":
        return max(1, math.ceil(payload / constants.DDP_BUCKET_BYTES))
    if per == "bucket":
        if setup.tensor_numels:  # whole tensors per bucket, as the engines cut them (sharding.partition)
            return max(1, len(bucket_groups(setup.tensor_numels, max(1, setup.bucket_elements))))
        return max(1, math.ceil(payload / (setup.bucket_elements * element)))
    if per == "unit":
        return max(1, setup.units)
    if per == "tensor":
        return max(1, setup.num_tensors)
    return 1


P2P_RING_OPS = ("reduce_scatter", "all_gather")
"""What our sharders run as rings of isend/irecv on gloo (zero_train/sharding/comm/gloo.py: gloo's own are
slower), priced at the calibration's measured p2p ring where there is one."""


def collective_seconds(
    machine: Machine, op: str, payload: int, calls: int, setup: CommSetup, *, p2p_ring: bool = False
) -> float:
    """Seconds of `calls` calls moving `payload` bytes in all, over the set-up's ranks (`p2p_ring`: an engine of
    ours, whose reduce-scatter and all-gather are point-to-point rings where the machine measured one)."""
    world = setup.world_size
    if world <= 1:
        return 0.0
    ring = p2p_ring and op in P2P_RING_OPS and "p2p_ring" in machine.measured
    measured = _measured(machine, "p2p_ring" if ring else op, world)
    if measured is not None:
        return calls * measured.latency_s + payload / (measured.payload_gbps * 1e9)
    nodes = math.ceil(world / setup.gpus_per_node)
    link = machine.link(nodes, setup.gpus_per_node)
    latency = link.latency_s + ring_hops(op, world) * link.hop_latency_s
    return calls * latency + ring_factor(op, world) * payload / (link.bus_gbps * 1e9)


def _measured(machine: Machine, op: str, world_size: int) -> Measured | None:
    """The calibration's figure for `op` at this world size (the nearest measured one, its rate scaled by the
    ring factors; a broadcast as an all-gather), None without one."""
    sizes = machine.measured.get(op) or machine.measured.get("all_gather" if op == "broadcast" else "")
    if not sizes:
        return None
    nearest = min(sizes, key=lambda n: (abs(math.log(n / world_size)), n))
    found = sizes[nearest]
    if nearest == world_size:
        return found
    kind = "all_gather" if op == "p2p_ring" else op
    scale = ring_factor(kind, nearest) / ring_factor(kind, world_size)
    return Measured(
        latency_s=found.latency_s * ring_hops(kind, world_size) / max(1, ring_hops(kind, nearest)),
        payload_gbps=found.payload_gbps * scale,
    )


def engine_calls(spec: EngineSpec, setup: CommSetup, machine: Machine) -> list[CommCall]:
    """Every collective of the engine's step, costed per occurrence."""
    calls = []
    for collective in spec.collectives:
        payload = payload_bytes(collective, setup)
        count = call_count(collective, setup, payload)
        if spec.family == DEEPSPEED and collective.phase == "backward_gather":
            released = released_for_backward(setup.num_params)
            payload, count = round(payload * released), math.ceil(count * released)
            if not count:  # kept gathered from forward: no second gather
                continue
        seconds = collective_seconds(machine, collective.op, payload, count, setup, p2p_ring=spec.ours)
        calls.append(CommCall(collective=collective, payload_bytes=payload, calls=count, seconds=seconds))
    return calls


def released_for_backward(num_params: int) -> float:
    """The fraction of its parameters DeepSpeed ZeRO-3 releases after forward and gathers again in backward:
    the blocks whose reuse distance (about twice the parameters after them) reaches
    constants.DEEPSPEED_STAGE3_REUSE_ELEMENTS; 0 below half that many parameters."""
    if num_params <= 0:
        return 1.0
    return max(0.0, 1.0 - constants.DEEPSPEED_STAGE3_REUSE_ELEMENTS / (2 * num_params))
