"""The cheapest training set-up that fits: `zero-train plan`'s logic, on top of the per-phase peak model.

    plan = make_plan(PlanRequest(model_shape=shape, nodes=2, gpus_per_node=8, gpu_memory_gb=80,
                                 host_memory_gb=1000, global_batch_size=512, block_size=4096))
    plan.chosen.setup.name     # e.g. "DeepSpeed ZeRO-2" with micro-batch 1 x accumulation 32

Set-ups are tried in order of expected speed, cheapest first (SETUP_ORDER): no offload before optimizer
offload before parameter offload; no activation recomputation before recomputation; less traffic per step
before more (DDP, ZeRO-1/2 and FSDP2 keeping parameters gathered: 2 Psi; ZeRO-3 and FSDP2 resharding: 3 Psi);
lower stages first among equals. For each, the largest micro-batch that divides the per-rank batch and fits
is taken (fewer accumulation steps: less time per sample).

A set-up fits when our per-phase peak (zero_train.memory.model.peak.engine_peak; `device_and_host` is the
one place that turns it into device and host bytes, so a fuller memory model replaces only that function)
stays below the GPU memory minus a headroom, and the host of one machine holds what its ranks put there:
the fp32 model every rank builds on the CPU before moving it (not under ZeRO-3's zero.Init) and offloaded
states. Activation checkpointing keeps each block's input and recomputes one block at a time;
optimizer offload moves fp32 masters, Adam's moments and fp32 gradients to the host; parameter offload
(ZeRO-3) also the 16-bit parameter partition. Accumulation and checkpointing are the peak model's own terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zero_train.memory.model.peak import engine_peak
from zero_train.memory.model.theory import ModelShape

GB = 1e9
FP32_BYTES = 4


@dataclass(kw_only=True, slots=True, frozen=True)
class Setup:
    """One way to train: an engine of the peak model, recomputation, offload."""

    engine: str
    """ddp, ds1, ds2, ds3, fsdp2-z2 or fsdp2-z3 (zero_train.memory.model.theory.ENGINE_STAGES)."""
    checkpointing: bool = False
    """Activation (gradient) checkpointing: recompute each block in backward."""
    offload_optimizer: bool = False
    """DeepSpeed's offload_optimizer to the CPU."""
    offload_param: bool = False
    """DeepSpeed's offload_param to the CPU (ZeRO-3 only)."""

    @property
    def stage(self) -> int:
        """The ZeRO stage of the JSON."""
        return {"ddp": 0, "ds1": 1, "ds2": 2, "ds3": 3, "fsdp2-z2": 2, "fsdp2-z3": 3}[self.engine]

    @property
    def train_engine(self) -> str:
        """scripts/train.py --engine."""
        if self.engine == "ddp":
            return "ddp"  # torch DDP reading the same JSON (what the peak model describes at stage 0)
        return "fsdp2" if self.engine.startswith("fsdp2") else "deepspeed"

    @property
    def name(self) -> str:
        """Words, e.g. "DeepSpeed ZeRO-3 + checkpointing + optimizer offload"."""
        base = {"ddp": "DDP (torch)", "fsdp2-z2": "FSDP2, kept gathered",
                "fsdp2-z3": "FSDP2, resharded"}.get(self.engine, f"DeepSpeed ZeRO-{self.stage}")  # fmt: skip
        extras = [
            word
            for flag, word in ((self.checkpointing, "checkpointing"), (self.offload_optimizer, "optimizer offload"),
                               (self.offload_param, "parameter offload"))
            if flag
        ]  # fmt: skip
        return " + ".join([base, *extras])


TRAFFIC_ORDER = ("ddp", "ds1", "ds2", "fsdp2-z2", "ds3", "fsdp2-z3")
"""2 Psi per step (all-reduce, or reduce-scatter + all-gather) before 3 Psi (ZeRO-3: parameters gathered twice)."""


def setup_order() -> list[Setup]:
    """Every set-up, cheapest (expected fastest) first."""
    order = []
    for offload in ("none", "optimizer", "param"):
        for checkpointing in (False, True):
            for engine in TRAFFIC_ORDER:
                if offload != "none" and engine.startswith("fsdp2"):
                    continue  # the fsdp2 engine does not offload (DeepSpeed's offload is what we model)
                if offload == "optimizer" and engine == "ddp":
                    continue  # offload needs ZeRO
                if offload == "param" and engine != "ds3":
                    continue
                order.append(Setup(engine=engine, checkpointing=checkpointing,
                                   offload_optimizer=offload != "none", offload_param=offload == "param"))  # fmt: skip
    return order


@dataclass(kw_only=True, slots=True, frozen=True)
class PlanRequest:
    """What `zero-train plan` is asked."""

    shape: ModelShape
    """The model."""
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
    headroom: float = 0.10
    """Fraction of device memory kept free (CUDA context, allocator fragmentation, NCCL buffers)."""
    backend: str = "nccl"
    """"nccl" (GPUs) or "gloo" (CPU ranks)."""

    @property
    def world_size(self) -> int:
        """Ranks over all machines."""
        return self.nodes * self.gpus_per_node

    def __post_init__(self):
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
    """Predicted peak per rank on the device."""
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


def device_and_host(
    request: PlanRequest, setup: Setup, micro_batch_size: int, grad_accum: int = 1
) -> tuple[int, str, int, dict]:
    """(device peak per rank, its phase, host bytes per machine, the peak phase's terms) of a set-up.

    The single place that turns the peak model into device and host bytes: the peak model counts
    accumulation and activation checkpointing; optimizer / parameter offload remove the terms DeepSpeed
    moves to the host (zero_train.memory.model.estimate.estimate_setup models DeepSpeed's offload buffers in
    full: the next step for the DeepSpeed set-ups here).
    """
    model = engine_peak(setup.engine, request.shape, request.world_size, precision=request.precision,
                        micro_batch_size=micro_batch_size, block_size=request.block_size, grad_accum=grad_accum,
                        gradient_checkpointing=setup.checkpointing, backend=request.backend,
                        ds_config=_bucket_config(request))  # fmt: skip
    e = FP32_BYTES if request.precision == "fp32" else 2
    psi, ranks = request.shape.num_params, request.gpus_per_node
    shard = -(-psi // request.world_size)
    moved = (
        ("master_params", "optimizer_states", "fp32_grads", "adamw_temporaries")
        if setup.offload_optimizer
        else ()
    )
    best, best_phase, best_terms = -1, "", {}
    for phase, terms in model.phases.items():
        terms = {name: value for name, value in terms.items() if name not in moved}
        if setup.offload_param:
            terms["params"] = max(0, terms.get("params", 0) - e * shard)
        if sum(terms.values()) > best:
            best, best_phase, best_terms = sum(terms.values()), phase, terms
    host = 0 if setup.stage == 3 and setup.train_engine == "deepspeed" else ranks * FP32_BYTES * psi
    if setup.offload_optimizer:
        host += ranks * (4 + 8 + 4) * shard  # fp32 masters, Adam moments, fp32 gradients per rank's shard
    if setup.offload_param:
        host += ranks * e * shard
    return best, best_phase, host, best_terms  # fmt: skip


def _bucket_config(request: PlanRequest) -> dict:
    """Bucket sizes as `zero-train config --model` writes them (hidden size squared)."""
    h = request.shape.hidden_size or 0
    zero = dict(reduce_bucket_size=h * h, stage3_prefetch_bucket_size=int(0.9 * h * h),
                stage3_param_persistence_threshold=10 * h) if h else {}  # fmt: skip
    return dict(zero_optimization=zero)


def evaluate(request: PlanRequest, setup: Setup) -> Candidate:
    """The set-up at its largest fitting micro-batch (or at micro-batch 1 with the reason it does not fit)."""
    per_rank = request.global_batch_size // request.world_size
    usable = request.gpu_memory_gb * GB * (1 - request.headroom)
    last = None
    for micro in sorted((m for m in range(1, per_rank + 1) if per_rank % m == 0), reverse=True):
        device, phase, host, terms = device_and_host(request, setup, micro, per_rank // micro)
        candidate = Candidate(setup=setup, micro_batch_size=micro, grad_accum=per_rank // micro,
                              device_bytes=device, peak_phase=phase, host_bytes=host, terms=terms)  # fmt: skip
        if host > request.host_memory_gb * GB:
            candidate.reason = (f"host {host / GB:.1f} GB per machine > {request.host_memory_gb:g} GB "
                                f"({request.gpus_per_node} ranks)")  # fmt: skip
            return candidate  # a smaller micro-batch does not shrink the host's share
        if device <= usable:
            return candidate
        last = candidate
    assert last is not None
    last.reason = (f"peak {last.device_bytes / GB:.1f} GB per rank ({last.peak_phase}) at micro-batch 1 > "
                   f"{usable / GB:.1f} GB usable ({request.gpu_memory_gb:g} GB - {request.headroom:.0%} headroom)")  # fmt: skip
    return last


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


def make_plan(request: PlanRequest, *, keep: int = 5) -> Plan:
    """Try the set-ups cheapest first; stop after `keep` that fit.

    Raises:
        ValueError: nothing fits (the message names the most economical set-up's shortfall).
    """
    fitting, rejected = [], []
    for setup in setup_order():
        candidate = evaluate(request, setup)
        (fitting if candidate.fits else rejected if not fitting else []).append(candidate)
        if len(fitting) >= keep:
            break
    if not fitting:
        last = rejected[-1]
        raise ValueError(f"no set-up fits: even {last.setup.name} needs {last.reason}; "
                         "use more GPUs, more memory, or a shorter --block-size")  # fmt: skip
    return Plan(request=request, fitting=fitting, rejected=rejected)
