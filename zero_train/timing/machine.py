"""The machine a step runs on: rates and bandwidths from a GPU preset (with overrides) or from a calibration.

    machine = preset_machine("h100-sxm")                        # the datasheet's figures, constants' efficiencies
    machine = preset_machine("a100-80", inter_node_gbps=25)     # another network
    machine = load_machine("calibration.json")                  # what `zero-train calibrate` measured here

Rates are what a step reaches, not peaks (a preset's peak x its efficiency; a calibration's measured rate), except
`peak_tflops`, MFU's denominator. On CPU ranks (`shared=True`) the ranks of one machine share its cores and its
memory bandwidth, so each gets 1/ranks of them.
"""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import asdict, dataclass, field

from zero_train.timing import constants
from zero_train.timing.presets import GPUS, LINKS


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """A collective's cost over one kind of link: bus bandwidth and latency."""

    bus_gbps: float
    """Achieved bus bandwidth, GB/s: a ring all-reduce of B bytes over N ranks takes 2(N-1)/N x B / this."""
    latency_s: float
    """Per call (launch and the first message)."""
    hop_latency_s: float = constants.HOP_LATENCY_S
    """Per ring step."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """One collective measured at one world size (calibration): seconds = latency_s + payload / payload_gbps."""

    latency_s: float
    payload_gbps: float
    """Payload (the ledger's bytes: all-reduce its tensor, all-gather its output, reduce-scatter its input) per
    second, GB/s."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Machine:
    """What the step-time model needs to know about a machine."""

    name: str
    device: str
    """"cuda" (a GPU per rank) or "cpu" (gloo ranks sharing the host)."""
    peak_tflops: dict[str, float]
    """Dense peak per precision (MFU's denominator; a calibrated CPU: its measured matmul rate)."""
    matmul_tflops: dict[str, float]
    """What the step's matmuls reach, per precision."""
    attention_tflops: dict[str, float]
    """What fused attention reaches, per precision (of the FLOPs it executes: causal skips half)."""
    memory_gbps: float
    """What elementwise ops reach, GB/s (bytes read + written)."""
    optimizer_gbps: float
    """What the optimizer step reaches over the rank's shard, GB/s (OPTIMIZER_BYTES_PER_PARAM per parameter)."""
    optimizer_layouts: dict[str, float] = field(default_factory=dict)
    """optimizer_gbps per way an engine runs its optimizer, where they differ (calibration: on a CPU torch's
    foreach AdamW over per-parameter tensors, what ddp, FSDP2 and ours run, is half as fast per byte as the
    single-tensor loop DeepSpeed runs over its flat partition): {"foreach": GB/s, "flat": GB/s}; a layout
    missing: optimizer_gbps."""
    intra: Link
    inter: Link
    host_gbps: float
    """Device <-> host copies (offload), GB/s."""
    cpu_adam_params_per_s: float
    """Parameters per second the host's optimizer updates (offload), for the whole machine."""
    overlap: float = 1.0
    """Fraction of overlappable communication time that hides behind compute: 1 on GPUs (NCCL kernels run
    beside compute), 0 on CPU ranks (gloo's threads need the same cores; docs/zero1.md, "Overlap")."""
    shared: bool = False
    """Ranks of one machine share its compute and memory bandwidth (CPU ranks)."""
    causal_fraction: float = constants.CAUSAL_FRACTION
    """Share of attention's counted FLOPs the kernel executes."""
    matmul_by_size: dict[str, dict[int, float]] = field(default_factory=dict)
    """Matmul TFLOPS per precision at square sizes (calibration): a step's rate is read at its matmuls' size."""
    linear_by_shape: dict[str, dict[str, float]] = field(default_factory=dict)
    """TFLOPS per precision of a linear layer's forward and backward matmuls at "tokens,width" (calibration): a
    step's matmul rate is read at its micro-batch's tokens and the model's width, where measured."""
    memory_scale: dict[str, float] = field(default_factory=dict)
    """memory_gbps x this for a precision (calibration: a CPU's bf16 elementwise ops differ from fp32's)."""
    measured: dict[str, dict[int, Measured]] = field(default_factory=dict)
    """Collectives measured per op and world size (calibration); used instead of `intra` where present."""
    cores: int = 0
    """The machine's cores (calibration; 0: unknown): with a rank's thread count they decide its share."""
    contention: dict[str, float] = field(default_factory=dict)
    """Per-core rate with every core busy / one core busy alone, by kind ("matmul": compute-bound, "memory":
    elementwise), measured by calibrate; {}: 1 (cores that share nothing)."""
    engine_host: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per engine, its host work per step beyond what the terms count (Python, hooks, flattening copies),
    FITTED on training steps measured on this machine (timing.host_work): {"per_micro_batch_s": a,
    "per_param_s": b}, seconds on one core, and where a fit shared them across engines "per_logit_s",
    "per_ckpt_layer_s", "per_call_s" (timing.host_work.SHARED); empty: none counted."""
    step_scale: float = 1.0
    """Every step on this machine x this, FITTED with the host work (timing.host_work.run_scale): the median of
    measured / predicted step over the calibration cells the fit's run measured (the shared CPU's speed that
    run, which the microbenchmarks alone miss); 1: not fitted (presets, a calibration alone)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each figure came from."""

    def per_rank(self, ranks_on_node: int, threads: int | None = None) -> float:
        """The share of compute and memory bandwidth one rank gets: 1/ranks of a shared machine, or, when each
        rank runs `threads` threads on a machine of known cores, those threads' cores (at most 1/ranks)."""
        if not self.shared:
            return 1.0
        if threads and self.cores:
            return min(threads / self.cores, 1.0 / ranks_on_node)
        return 1.0 / ranks_on_node

    def rank_share(self, kind: str, ranks_on_node: int, threads: int | None = None) -> float:
        """per_rank, times the calibrated contention of `kind` ("matmul" or "memory") for the cores the node's
        ranks keep busy (none with one busy core; all of it with every core busy, linear between). At most 1:
        cores busy together cannot each run faster than one alone, so a measured ratio above 1 is the timing's
        noise (design v5's calibration measured memory 1.40 where v3's and v4's measured 0.77 and 0.72)."""
        share = self.per_rank(ranks_on_node, threads)
        factor = min(1.0, self.contention.get(kind) or 0.0)
        if not self.shared or not factor or self.cores < 2:
            return share
        busy = min(self.cores, ranks_on_node * (threads or max(1, self.cores // ranks_on_node)))
        return share * (1 - (1 - factor) * (busy - 1) / (self.cores - 1))

    def host_cores_per_rank(self, ranks_on_node: int) -> float:
        """Cores a rank's single-threaded host work (Python, hooks) gets: 1, less when ranks outnumber cores."""
        if not self.shared or not self.cores:
            return 1.0
        return min(1.0, self.cores / ranks_on_node)

    def link(self, nodes: int, gpus_per_node: int) -> Link:
        """The link a collective over `nodes` machines runs at: within one, the intra-node link; across several,
        a ring crosses the network once per machine and channel, so its bus bandwidth is the smaller of the
        intra-node link and the machine's network (gpus_per_node NICs, one per GPU)."""
        if nodes <= 1:
            return self.intra
        bus = min(self.intra.bus_gbps, gpus_per_node * self.inter.bus_gbps)
        return Link(bus_gbps=bus, latency_s=self.inter.latency_s, hop_latency_s=self.inter.hop_latency_s)

    def matmul_rate(self, precision: str, size: float) -> float:
        """TFLOPS of the step's matmuls: at `size` (the cube root of M x N x K of a typical one) on a calibrated
        machine, interpolated log-log between the sizes measured; else matmul_tflops."""
        rates = self.matmul_by_size.get(precision)
        if not rates or size <= 0:
            return self.matmul_tflops[precision]
        sizes = sorted(rates)
        if size <= sizes[0] or size >= sizes[-1]:
            return rates[sizes[0] if size <= sizes[0] else sizes[-1]]
        low = max(n for n in sizes if n <= size)
        high = min(n for n in sizes if n >= size)
        if low == high:
            return rates[low]
        weight = math.log(size / low) / math.log(high / low)
        return math.exp(math.log(rates[low]) * (1 - weight) + math.log(rates[high]) * weight)

    def optimizer_rate(self, layout: str) -> float:
        """GB/s of the optimizer step run as `layout` ("foreach" or "flat")."""
        return self.optimizer_layouts.get(layout, self.optimizer_gbps)

    def linear_rate(self, precision: str, tokens: int, width: int) -> float | None:
        """TFLOPS of the step's matmuls at `tokens` rows and `width` (log-log interpolation between the shapes
        measured, clamped at their edges); None where no linear layer was measured."""
        table = self.linear_by_shape.get(precision)
        if not table or tokens <= 0 or width <= 0:
            return None
        points = {tuple(int(v) for v in key.split(",")): rate for key, rate in table.items()}
        weights = [_bracket(sorted({p[axis] for p in points}), (tokens, width)[axis]) for axis in (0, 1)]
        log_rate = sum(
            wt * wh * math.log(points[(t, h)]) for t, wt in weights[0] for h, wh in weights[1] if wt and wh
        )
        return math.exp(log_rate)

    def memory_rate(self, precision: str) -> float:
        """GB/s of elementwise ops in this precision."""
        return self.memory_gbps * self.memory_scale.get(precision, 1.0)

    def as_dict(self) -> dict:
        """JSON-ready (what `zero-train calibrate` writes)."""
        result = asdict(self)
        result["measured"] = {
            op: {str(n): asdict(m) for n, m in sizes.items()} for op, sizes in self.measured.items()
        }
        return result


def preset_machine(
    gpu: str,
    *,
    tflops: float | None = None,
    intra_node_gbps: float | None = None,
    inter_node_gbps: float | None = None,
) -> Machine:
    """A GPU preset's machine (presets.GPUS), with overrides.

    Args:
        gpu: a GPUS key.
        tflops: the dense BF16/FP16 peak instead of the datasheet's (fp32 scaled alike).
        intra_node_gbps: the link between a machine's GPUs, GB/s one direction (instead of the preset's).
        inter_node_gbps: the network per GPU, Gb/s (bits, as NICs are sold), instead of the preset's.

    Raises:
        ValueError: an unknown GPU, or an override that is not positive.
    """
    if gpu not in GPUS:
        raise ValueError(f"unknown --gpu {gpu!r}; choose one of {', '.join(GPUS)}")
    for flag, value in (
        ("--tflops", tflops),
        ("--intra-node-gbps", intra_node_gbps),
        ("--inter-node-gbps", inter_node_gbps),
    ):
        if value is not None and not value > 0:
            raise ValueError(f"{flag} {value:g} must be positive")
    preset = GPUS[gpu]
    scale = tflops / preset.tflops["bf16"] if tflops else 1.0
    peak = {precision: rate * scale for precision, rate in preset.tflops.items()}
    intra = intra_node_gbps or LINKS[preset.intra_link].gbps
    inter = inter_node_gbps / 8 if inter_node_gbps else LINKS[preset.inter_link].gbps
    host = LINKS[preset.host_link].gbps
    return Machine(
        name=gpu,
        device="cuda",
        peak_tflops=peak,
        matmul_tflops={p: rate * constants.MATMUL_EFFICIENCY[gpu] for p, rate in peak.items()},
        attention_tflops={p: rate * constants.ATTENTION_EFFICIENCY for p, rate in peak.items()},
        memory_gbps=preset.memory_gbps * constants.MEMORY_EFFICIENCY,
        optimizer_gbps=preset.memory_gbps * constants.MEMORY_EFFICIENCY,
        intra=Link(bus_gbps=intra * constants.LINK_EFFICIENCY, latency_s=constants.LAUNCH_LATENCY_S["intra"]),
        inter=Link(bus_gbps=inter * constants.LINK_EFFICIENCY, latency_s=constants.LAUNCH_LATENCY_S["inter"]),
        host_gbps=host * constants.PCIE_EFFICIENCY,
        cpu_adam_params_per_s=constants.CPU_ADAM_PARAMS_PER_S,
        sources={
            "gpu": preset.source,
            "intra": LINKS[preset.intra_link].source,
            "inter": LINKS[preset.inter_link].source,
            "host": LINKS[preset.host_link].source,
            "overrides": ", ".join(
                f"{k} {v:g}"
                for k, v in (
                    ("tflops", tflops),
                    ("intra GB/s", intra_node_gbps),
                    ("inter Gb/s", inter_node_gbps),
                )
                if v
            ),
        },
    )


def load_machine(path: str | pathlib.Path) -> Machine:
    """The machine a calibration JSON describes (ValueError naming the file if it is not one)."""
    try:
        data = json.loads(pathlib.Path(path).read_text())
        measured = {
            op: {int(n): Measured(**m) for n, m in sizes.items()}
            for op, sizes in data.pop("measured", {}).items()
        }
        data["matmul_by_size"] = {
            p: {int(n): rate for n, rate in rates.items()}
            for p, rates in data.get("matmul_by_size", {}).items()
        }
        intra, inter = Link(**data.pop("intra")), Link(**data.pop("inter"))
        return Machine(**data, intra=intra, inter=inter, measured=measured)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise ValueError(
            f"--machine {path}: not a calibration file ({err}); write one with zero-train calibrate"
        ) from err


def _bracket(grid: list[int], value: float) -> list[tuple[int, float]]:
    """The grid points around `value` with their log-linear weights (one point, weight 1, outside the grid)."""
    if value <= grid[0] or value >= grid[-1]:
        return [(grid[0] if value <= grid[0] else grid[-1], 1.0)]
    low = max(n for n in grid if n <= value)
    high = min(n for n in grid if n >= value)
    if low == high:
        return [(low, 1.0)]
    weight = math.log(value / low) / math.log(high / low)
    return [(low, 1 - weight), (high, weight)]


def ring_hops(op: str, world_size: int) -> int:
    """Ring steps of a collective (all-reduce: a tree's 2 log2 N where that is fewer, as NCCL picks)."""
    if world_size <= 1:
        return 0
    if op == "all_reduce":
        return min(2 * (world_size - 1), 2 * math.ceil(math.log2(world_size)))
    return world_size - 1
