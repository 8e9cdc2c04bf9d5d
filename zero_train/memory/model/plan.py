"""The cheapest training set-up that fits: `zero-train plan`'s logic, on top of the per-phase peak model.

    plan = make_plan(PlanRequest(model_shape=shape, nodes=2, gpus_per_node=8, gpu_memory_gb=80,
                                 host_memory_gb=1000, global_batch_size=512, block_size=4096))
    plan.chosen.setup.name     # e.g. "DeepSpeed ZeRO-2" with micro-batch 1 x accumulation 32

Set-ups are tried in order of expected speed, cheapest first (SETUP_ORDER): no offload before optimizer
offload before parameter offload; no activation recomputation before recomputation; less traffic per step
before more (DDP, ZeRO-1/2 and FSDP2 keeping parameters gathered: 2 Psi; ZeRO-3 and FSDP2 resharding: 3 Psi);
lower stages first among equals. For each, the largest micro-batch that divides the per-rank batch and fits
is taken (fewer accumulation steps: less time per sample).

A set-up fits when the estimate of that set-up (zero_train.memory.model.engine_estimate.estimate_engine, the same
function `zero-train estimate` uses) fits: the activations counted on the model's real architecture (fake
tensors, once per micro-batch size and checkpointing choice), the per-phase peak of the engine, DeepSpeed's
offload buffers moved to the host) plus the caching allocator's slack for the bytes it churns is at most the
GPU's memory minus the GPU margin (gpu_terms: CUDA context, NCCL buffers; rules from published measurements;
`gpu_margin_gb` replaces all three) and an optional extra fraction (--headroom); and the host of one machine holds what its ranks put there (the model each rank builds in
--load-dtype before moving it, none under ZeRO-3's zero.Init on GPUs: host_build; and offloaded states). The
JSON the estimate reads is the one the plan writes (setup_config).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zero_train.ds_config.generate import ConfigRequest, generate_config
from zero_train.memory.model import limits, offload
from zero_train.memory.model.engine_estimate import StageEstimate, estimate_engine
from zero_train.memory.model.estimate import counted_activations
from zero_train.memory.model.gpu_terms import gpu_margin, transient
from zero_train.memory.model.theory import ModelShape
from zero_train.registry import DEEPSPEED, ENGINES, engine_spec

GB = 1e9


@dataclass(kw_only=True, slots=True, frozen=True)
class Setup:
    """One way to train: an engine of the peak model, recomputation, offload."""

    engine: str
    """An engine `zero-train plan` may choose (zero_train.registry: `planned`), e.g. "ds3"; also train.py's --engine."""
    checkpointing: bool = False
    """Activation (gradient) checkpointing: recompute each block in backward."""
    offload_optimizer: bool = False
    """DeepSpeed's offload_optimizer to the CPU."""
    offload_param: bool = False
    """DeepSpeed's offload_param to the CPU (ZeRO-3 only)."""

    @property
    def stage(self) -> int:
        """The ZeRO stage of the JSON."""
        return engine_spec(self.engine).stage

    @property
    def family(self) -> str | None:
        """The library ("deepspeed", "fsdp2"; None: torch DDP), e.g. for accelerate's plugin."""
        return engine_spec(self.engine).family

    @property
    def name(self) -> str:
        """Words, e.g. "DeepSpeed ZeRO-3 + checkpointing + optimizer offload"."""
        base = engine_spec(self.engine).label
        extras = [
            word
            for flag, word in (
                (self.checkpointing, "checkpointing"),
                (self.offload_optimizer, "optimizer offload"),
                (self.offload_param, "parameter offload"),
            )
            if flag
        ]
        return " + ".join([base, *extras])


TRAFFIC_ORDER = tuple(
    spec.name for spec in sorted((s for s in ENGINES if s.planned), key=lambda s: s.stage == 3)
)
"""2 Psi per step (all-reduce, or reduce-scatter + all-gather) before 3 Psi (ZeRO-3: parameters gathered twice);
lower stages first among equals (the registry's order)."""


def setup_order() -> list[Setup]:
    """Every set-up, cheapest (expected fastest) first."""
    order = []
    for moved in ("none", "optimizer", "param"):
        for checkpointing in (False, True):
            for engine in TRAFFIC_ORDER:
                spec = engine_spec(engine)
                offloads = (
                    spec.family == DEEPSPEED and spec.stage > 0
                )  # DeepSpeed's offload (what we model) needs ZeRO
                if (moved != "none" and not offloads) or (moved == "param" and spec.stage != 3):
                    continue
                order.append(
                    Setup(
                        engine=engine,
                        checkpointing=checkpointing,
                        offload_optimizer=moved != "none",
                        offload_param=moved == "param",
                    )
                )
    return order


@dataclass(kw_only=True, slots=True, frozen=True)
class PlanRequest:
    """What `zero-train plan` is asked."""

    shape: ModelShape
    """The model's shape (theory.model_shape)."""
    config: object = None
    """Its transformers config: activations are counted on the real architecture. None: the shape's
    GPT-2-like activation terms (a bare shape, e.g. in tests of the ranking)."""
    nodes: int
    """Machines."""
    gpus_per_node: int
    """Ranks per machine."""
    gpu_memory_gb: float
    """Device memory of one rank, GB (1e9 bytes)."""
    host_memory_gb: float
    """CPU memory of one machine, GB."""
    global_batch_size: int
    """Sequences per optimizer step over all ranks."""
    block_size: int
    """Tokens per sequence."""
    precision: str = "bf16"
    """Training precision."""
    load_dtype: str = "fp32"
    """The dtype train.py builds the model in on each rank's host (--load-dtype; ZeRO-3 uses zero.Init)."""
    headroom: float = 0.0
    """Fraction of device memory kept free beyond the GPU margin."""
    gpu_margin_gb: float | None = None
    """GB kept free on each GPU for what the peak model does not count; None: gpu_terms.GpuMargin's default
    (CUDA context, NCCL buffers, allocator slack). No margin on CPU ranks (backend gloo)."""
    backend: str = "nccl"
    """"nccl" (GPUs) or "gloo" (CPU ranks)."""
    lora: object = None
    """A zero_train.hf.lora.LoraSpec: LoRA adapters on a frozen base (the shape must be model_shape's with the
    same spec); None: full fine-tuning."""

    @property
    def world_size(self) -> int:
        """Ranks over all machines."""
        return self.nodes * self.gpus_per_node

    @property
    def margin(self) -> dict[str, int]:
        """The GPU margin's terms in bytes that do not depend on the set-up ({} on CPU ranks)."""
        if self.backend != "nccl":
            return {}
        margin = None if self.gpu_margin_gb is None else self.gpu_margin_gb * GB
        terms = gpu_margin(world_size=self.world_size, margin_bytes=margin)
        terms.pop("allocator_slack", None)  # per set-up: slack_bytes
        return terms

    def slack_bytes(self, terms: dict[str, int]) -> int:
        """The caching allocator's slack for a set-up's peak `terms` (0 on CPU ranks or with --gpu-margin)."""
        if self.backend != "nccl" or self.gpu_margin_gb is not None:
            return 0
        return gpu_margin(world_size=self.world_size, transient_bytes=transient(terms))["allocator_slack"]

    @property
    def usable_bytes(self) -> float:
        """What a rank's predicted peak may reach: the GPU's memory minus the margin and the headroom."""
        return self.gpu_memory_gb * GB * (1 - self.headroom) - sum(self.margin.values())

    def __post_init__(self):
        limits.check(
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            plan_world_size=self.world_size,
            gpu_memory_gb=self.gpu_memory_gb,
            host_memory_gb=self.host_memory_gb,
            global_batch_size=self.global_batch_size,
            block_size=self.block_size,
        )
        if self.usable_bytes <= 0:
            raise ValueError(
                f"the GPU margin ({sum(self.margin.values()) / GB:g} GB) and --headroom {self.headroom:g} leave "
                f"nothing of {self.gpu_memory_gb:g} GB; give a smaller --gpu-margin or --headroom"
            )
        if self.global_batch_size % self.world_size:
            raise ValueError(
                f"--global-batch-size {self.global_batch_size} is not a multiple of the {self.world_size} ranks "
                f"({self.nodes} nodes x {self.gpus_per_node}); use a multiple of {self.world_size}"
            )


@dataclass(kw_only=True, slots=True)
class Candidate:
    """One set-up at one micro-batch, with what it needs."""

    setup: Setup
    micro_batch_size: int
    grad_accum: int
    device_bytes: int = 0
    """Predicted (allocated) peak per rank on the device, the margin not included."""
    slack_bytes: int = 0
    """The caching allocator's slack kept free beside it on a GPU (PlanRequest.slack_bytes)."""
    peak_phase: str = ""
    host_bytes: int = 0
    """Predicted host memory of one machine (all its ranks)."""
    reason: str = ""
    """Why it does not fit ("" if it does)."""
    terms: dict[str, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        """True when nothing is too large."""
        return not self.reason


def setup_config(
    request: PlanRequest, setup: Setup, micro_batch_size: int, grad_accum: int, *, hf_auto: bool = False
) -> dict:
    """The DeepSpeed JSON of a set-up (zero_train.ds_config's generator, buckets from the model's width):
    what the plan writes, and what its estimate reads. hf_auto: the same memory, with "auto" for what the HF
    Trainer's arguments own (lr, betas, eps, weight decay, clipping) and no scheduler block (its own)."""
    return generate_config(
        ConfigRequest(
            stage=setup.stage,
            precision=request.precision,
            offload_optimizer="cpu" if setup.offload_optimizer else "none",
            offload_param="cpu" if setup.offload_param else "none",
            micro_batch_size=micro_batch_size,
            grad_accum=grad_accum,
            world_size=request.world_size,
            hidden_size=request.shape.hidden_size or None,
            hf_auto=hf_auto,
        )
    )


class ActivationCounts:
    """One fake-tensor count per (micro-batch size, checkpointing) of a request, shared by every engine."""

    def __init__(self, request: PlanRequest) -> None:
        self.request = request
        self.counts: dict[tuple[int, bool], object] = {}

    def get(self, micro_batch_size: int, checkpointing: bool):
        """The ActivationCount, or None for a bare shape."""
        if self.request.config is None:
            return None
        key = (micro_batch_size, checkpointing)
        if key not in self.counts:
            self.counts[key] = counted_activations(
                self.request.config,
                precision=self.request.precision,
                micro_batch_size=micro_batch_size,
                block_size=self.request.block_size,
                gradient_checkpointing=checkpointing,
                lora=self.request.lora,
            )
        return self.counts[key]


def estimate_candidate(
    request: PlanRequest, setup: Setup, micro_batch_size: int, grad_accum: int, counts: ActivationCounts
) -> StageEstimate:
    """The estimate of one set-up at one micro-batch (zero-train estimate's numbers for the same JSON)."""
    ds_config = setup_config(request, setup, micro_batch_size, grad_accum)
    return estimate_engine(
        setup.engine,
        request.shape,
        counts.get(micro_batch_size, setup.checkpointing),
        request.world_size,
        per_node=request.gpus_per_node,
        usable_gpu_bytes=None,
        host_memory_bytes=None,
        deepspeed_peer=False,
        settings=offload.OffloadSettings.from_config(ds_config),
        device="cuda" if request.backend == "nccl" else "cpu",
        precision=request.precision,
        micro_batch_size=micro_batch_size,
        block_size=request.block_size,
        grad_accum=grad_accum,
        gradient_checkpointing=setup.checkpointing,
        ds_config=ds_config,
        load_dtype=request.load_dtype,
    )


def _candidate(request, setup, micro, per_rank, counts) -> Candidate:
    row = estimate_candidate(request, setup, micro, per_rank // micro, counts)
    terms = row.device_phases[row.device_peak_phase]
    return Candidate(
        setup=setup,
        micro_batch_size=micro,
        grad_accum=per_rank // micro,
        device_bytes=row.device_peak_bytes,
        slack_bytes=request.slack_bytes(terms),
        peak_phase=row.device_peak_phase,
        host_bytes=row.host_per_node_bytes,
        terms=terms,
    )


def evaluate(request: PlanRequest, setup: Setup, counts: ActivationCounts | None = None) -> Candidate:
    """The set-up at its largest fitting micro-batch (or at micro-batch 1 with the reason it does not fit).

    The micro-batch sizes are the divisors of the per-rank batch; the device bytes grow with the micro-batch,
    so the largest that fits is found by bisection (a few counts, not one per divisor). The host's share does
    not shrink with the micro-batch: a set-up whose host does not fit at micro-batch 1 does not fit.
    """
    counts = counts or ActivationCounts(request)
    per_rank = request.global_batch_size // request.world_size
    usable = request.usable_bytes
    micros = _divisors(per_rank)
    smallest = _candidate(request, setup, micros[0], per_rank, counts)
    if smallest.host_bytes > request.host_memory_gb * GB:
        smallest.reason = (
            f"host {smallest.host_bytes / GB:.1f} GB per machine > {request.host_memory_gb:g} GB "
            f"({request.gpus_per_node} ranks)"
        )
        return smallest
    if smallest.device_bytes + smallest.slack_bytes > usable:
        slack = f" + {smallest.slack_bytes / GB:.1f} GB allocator slack" if smallest.slack_bytes else ""
        smallest.reason = (
            f"{smallest.device_bytes / GB:.1f} GB per rank ({smallest.peak_phase}){slack} at "
            f"micro-batch 1 > {usable / GB:.1f} GB usable"
        )
        return smallest
    best, low, high = smallest, 1, len(micros) - 1  # micros[low - 1] fits; bisect in [low, high]
    while low <= high:
        middle = (low + high) // 2
        candidate = _candidate(request, setup, micros[middle], per_rank, counts)
        if candidate.device_bytes + candidate.slack_bytes <= usable:
            best, low = candidate, middle + 1
        else:
            high = middle - 1
    return best


def _divisors(number: int) -> list[int]:
    """The divisors of `number`, ascending (sqrt(number) steps: a per-rank batch may be large)."""
    small = [d for d in range(1, int(number**0.5) + 1) if number % d == 0]
    return sorted({*small, *(number // d for d in small)})


@dataclass(kw_only=True, slots=True)
class Plan:
    """The set-ups that fit, cheapest first, and the cheaper ones that do not."""

    request: PlanRequest
    fitting: list[Candidate]
    rejected: list[Candidate]

    @property
    def chosen(self) -> Candidate:
        """The cheapest set-up that fits."""
        return self.fitting[0]


def make_plan(request: PlanRequest, *, keep: int = 5, engines: tuple[str, ...] | None = None) -> Plan:
    """Try the set-ups cheapest first; stop after `keep` that fit.

    Args:
        engines: only set-ups of these engines (Setup.engine), e.g. DeepSpeed's for the HF Trainer; None: all.

    Raises:
        ValueError: nothing fits (the message names the most economical set-up's shortfall).
    """
    fitting, rejected = [], []
    counts = ActivationCounts(request)
    for setup in setup_order():
        if engines is not None and setup.engine not in engines:
            continue
        candidate = evaluate(request, setup, counts)
        (fitting if candidate.fits else rejected if not fitting else []).append(candidate)
        if len(fitting) >= keep:
            break
    if not fitting:
        last = rejected[-1]
        raise ValueError(
            f"no set-up fits: even {last.setup.name} needs {last.reason}; "
            "use more GPUs, more memory, or a shorter --block-size"
        )
    return Plan(request=request, fitting=fitting, rejected=rejected)
