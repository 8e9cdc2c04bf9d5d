"""One training step's predicted time, as named terms: compute, the communication left exposed, the optimizer.

    step = step_time(shape, count, StepSetup(engine="ds3", world_size=16, gpus_per_node=8, micro_batch_size=2,
                                             block_size=4096, grad_accum=8), preset_machine("h100-sxm"))
    step.seconds, step.tokens_per_s, step.mfu, step.terms        # {"matmuls forward": ..., ...}

- compute, per micro-batch: the FLOPs of the forward and backward counted on the real architecture
  (memory.model.activations: torch's FLOP counter on the same fake-tensor pass that counts activations; the
  recomputation under checkpointing; attention's seq^2 term apart), over the machine's matmul and attention
  rates, and the bytes every other op reads and writes over its memory bandwidth;
- communication: the engine's collectives (registry: what, when, how many calls; comm.py: seconds), and what of
  them hides: reductions launched during backward hide behind it but the last bucket; ZeRO-3's and FSDP2's
  gathers hide behind the forward / backward they prefetch for but the first unit's; blocking and after-step
  collectives stay exposed (a machine's `overlap`: 1 on GPUs, 0 on CPU ranks, whose gloo threads share the cores);
- optimizer: the gradient clip's bytes over the rank's shard / memory bandwidth, and the bytes AdamW reads and
  writes / the machine's optimizer bandwidth for the way the engine runs it (DeepSpeed: one flat tensor);
  offload: the shard's bytes over PCIe and the host's optimizer rate (shared by the machine's ranks);
- host work: on a machine whose engines' host work was fitted (timing.host_work), that engine's.
The step is the sum; tokens/s, MFU and the time to train N tokens follow. Pure arithmetic: microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zero_train.memory.model.theory import ModelShape
from zero_train.registry import DEEPSPEED, engine_spec
from zero_train.timing import constants, host_work
from zero_train.timing.comm import CommSetup, engine_calls
from zero_train.timing.machine import Machine


@dataclass(frozen=True, kw_only=True, slots=True)
class StepSetup:
    """One way to train, as far as time is concerned."""

    engine: str
    world_size: int
    gpus_per_node: int
    micro_batch_size: int
    block_size: int
    grad_accum: int = 1
    gradient_checkpointing: bool = False
    precision: str = "bf16"
    offload_optimizer: bool = False
    offload_param: bool = False
    bucket_elements: int = constants.DEEPSPEED_DEFAULT_BUCKET_ELEMENTS
    """The config's reduce_bucket_size."""
    overlap_comm: bool | None = None
    """The config's overlap_comm: True makes blocking reductions overlapped ones; None: the engine's default."""
    gradient_clipping: bool = True
    """The config clips gradients by their global norm (the generated configs' gradient_clipping 1.0)."""
    threads_per_rank: int | None = None
    """CPU ranks: each rank's threads (OMP_NUM_THREADS; the bench's launches set 1); None: the machine's cores
    shared equally (runtime.dist.share_cpu_threads)."""

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over all ranks."""
        return self.world_size * self.micro_batch_size * self.block_size * self.grad_accum


@dataclass(kw_only=True, slots=True)
class StepTime:
    """A step's predicted seconds by term, and what follows from them."""

    terms: dict[str, float]
    """Seconds each term adds to the step (communication: its exposed part)."""
    hidden: dict[str, float] = field(default_factory=dict)
    """Seconds of communication hidden behind compute, per collective."""
    comm: dict[str, dict] = field(default_factory=dict)
    """Per collective: calls and payload bytes per step."""
    tokens_per_step: int = 0
    model_flops: float = 0.0
    """FLOPs per rank per step without recomputation (MFU's numerator)."""
    peak_flops: float = 0.0
    """The rank's dense peak, FLOP/s."""
    sync_points: int = 0
    """Where a rank waits for its peers in the step (sync_points; 0 at one rank)."""

    @property
    def seconds(self) -> float:
        """The step."""
        return sum(self.terms.values())

    @property
    def tokens_per_s(self) -> float:
        """Over all ranks."""
        return self.tokens_per_step / self.seconds

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs per second per rank / the rank's dense peak."""
        return self.model_flops / self.seconds / self.peak_flops

    def hours_for(self, tokens: float) -> float:
        """Hours to train `tokens` tokens at this step."""
        return tokens / self.tokens_per_s / 3600

    def as_dict(self) -> dict:
        """JSON-ready, with seconds, tokens/s and MFU."""
        # One keyword per field, the shape of Compute.of, timing.ranking.step_setup and cli.config's
        # request_from_args: each copies a different record, so there is nothing to share.
        return dict(
            terms=self.terms,
            hidden=self.hidden,
            comm=self.comm,
            seconds=self.seconds,
            tokens_per_s=self.tokens_per_s,
            mfu=self.mfu,
            tokens_per_step=self.tokens_per_step,
            model_flops=self.model_flops,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Compute:
    """One micro-batch's work on one rank: FLOPs by kind and bytes of the other ops."""

    forward_flops: float
    backward_flops: float
    """Recomputation included."""
    recompute_flops: float
    attention_flops: float
    memory_bytes: float

    @classmethod
    def of(cls, shape: ModelShape, count, tokens: int) -> Compute:
        """From an ActivationCount; without one (a bare parameter count), 2N FLOPs per token forward and
        4N backward (Kaplan et al. 2020's 6N), nothing else."""
        if count is None or not count.forward_flops:
            return cls(
                forward_flops=2.0 * shape.num_params * tokens,
                backward_flops=4.0 * shape.num_params * tokens,
                recompute_flops=0.0,
                attention_flops=0.0,
                memory_bytes=0.0,
            )
        missed = _recompute_missed(shape, count, tokens)
        return cls(
            forward_flops=count.forward_flops,
            backward_flops=count.backward_flops + missed,
            recompute_flops=count.recompute_flops + missed,
            attention_flops=count.attention_flops,
            memory_bytes=count.memory_bytes,
        )


def _recompute_missed(shape: ModelShape, count, tokens: int) -> float:
    """FLOPs of the checkpointed blocks' forward that run again in backward but the count's recompute lacks.

    torch's non-reentrant checkpoint re-runs a block's forward until every tensor its backward saved is back,
    and a linear layer saves its weight as well as its input, so the block's last linear runs again too: the
    whole block's forward (torch's profiler, one step on this CPU: gpt2-25m's 48 block addmm per forward are 96
    under checkpointing, llama-tiny's 14 block matmuls 28, tiny's 8 addmm 16). The count's fake pass runs
    under a dispatch mode (memory.model.watch.OpCost), under which torch stops one linear earlier (gpt2-25m at
    2 x 64 tokens: 3.77 of 5.59 GFLOP), so the recompute is raised to the blocks' forward: the forward less the
    LM head's 2 x tokens x hidden x vocab (the 8N FLOPs per token of full recomputation; Korthikanti et al.
    2022, arXiv:2205.05198, section 5)."""
    if not count.recompute_flops or not shape.hidden_size or not shape.vocab_size:
        return 0.0
    blocks = count.forward_flops - 2.0 * tokens * shape.hidden_size * shape.vocab_size
    return max(0.0, blocks - count.recompute_flops)


def step_time(shape: ModelShape, count, setup: StepSetup, machine: Machine) -> StepTime:
    """The predicted time of one optimizer step.

    Args:
        shape: the model (memory.model.theory.ModelShape).
        count: its ActivationCount for this micro-batch and checkpointing (memory.model.activations), or None.
        setup: the set-up.
        machine: the machine (timing.machine).

    Returns:
        The StepTime.
    """
    spec = engine_spec(setup.engine)
    ranks_on_node = min(setup.gpus_per_node, setup.world_size)
    share = machine.per_rank(ranks_on_node, setup.threads_per_rank)
    work = Compute.of(shape, count, setup.micro_batch_size * setup.block_size)
    size = (
        (setup.micro_batch_size * setup.block_size * shape.hidden_size**2) ** (1 / 3)
        if shape.hidden_size
        else 0
    )
    shares = {
        kind: machine.rank_share(kind, ranks_on_node, setup.threads_per_rank) for kind in ("matmul", "memory")
    }
    terms, seconds = _compute_terms(work, setup, machine, shares, size, shape.hidden_size)
    forward_s, backward_s = seconds
    # Field by field, as ds_config.settings.resolve_auto's values and cli/gpu_check.py's Options: other records.
    comm_setup = CommSetup(
        world_size=setup.world_size,
        gpus_per_node=setup.gpus_per_node,
        precision=setup.precision,
        num_params=shape.num_params,
        trainable_params=shape.trainable_params,
        num_tensors=len(shape.trained_numels) or 1,
        units=shape.num_layers + 2,
        bucket_elements=setup.bucket_elements,
        tensor_numels=tuple(shape.trained_numels),
    )
    calls = engine_calls(spec, comm_setup, machine)
    exposed, hidden, comm = _overlap(calls, setup, machine, forward_s, backward_s)
    waits = sync_points(calls, setup) if setup.world_size > 1 else 0
    terms.update(exposed)
    terms.update(_optimizer_terms(shape, spec, setup, machine, shares["memory"], ranks_on_node))
    if setup.engine in machine.engine_host:
        model_s = sum(terms.values())
        terms[host_work.TERM] = host_work.host_seconds(
            machine,
            setup.engine,
            grad_accum=setup.grad_accum,
            num_params=shape.num_params,
            ranks_on_node=ranks_on_node,
            comm_s=sum(value for name, value in terms.items() if name.startswith("comm: ")),
            logits=setup.micro_batch_size * setup.block_size * (shape.vocab_size or 0),
            ckpt_layers=shape.num_layers if setup.gradient_checkpointing else 0,
            calls=sum(entry["calls"] for entry in comm.values()) if setup.world_size > 1 else 0,
            sync_points=waits,
            world_size=setup.world_size,
            model_s=model_s,
            ops=count.ops if count is not None else 0,
        )
    if machine.step_scale != 1.0:  # the run's speed: every term alike, named so that the terms still sum
        terms[host_work.SCALE_TERM] = (machine.step_scale - 1.0) * sum(terms.values())
    model_flops = setup.grad_accum * (work.forward_flops + work.backward_flops - work.recompute_flops)
    return StepTime(
        terms=terms,
        hidden=hidden,
        comm=comm,
        tokens_per_step=setup.tokens_per_step,
        model_flops=model_flops,
        peak_flops=machine.peak_tflops[setup.precision] * 1e12 * share,
        sync_points=waits,
    )


def _compute_terms(
    work: Compute, setup: StepSetup, machine: Machine, shares: dict[str, float], size: float, width: int
):
    """Compute seconds per step by term, and (forward, backward) seconds of one micro-batch (the windows
    communication can hide behind). `size`: a typical matmul's (tokens x hidden x hidden)^(1/3), `width` the
    model's hidden size (a calibrated CPU's rate is read at the micro-batch's tokens and it); `shares`: the
    rank's share of the machine's matmul and memory rates (Machine.rank_share)."""
    tokens = setup.micro_batch_size * setup.block_size
    rate = machine.linear_rate(setup.precision, tokens, width) or machine.matmul_rate(setup.precision, size)
    matmul = rate * 1e12 * shares["matmul"]
    attention = machine.attention_tflops[setup.precision] * 1e12 * shares["matmul"]
    memory = machine.memory_rate(setup.precision) * 1e9 * shares["memory"]
    total = work.forward_flops + work.backward_flops
    attention_s = work.attention_flops * machine.causal_fraction / attention
    memory_s = work.memory_bytes / memory
    plain = total - work.attention_flops  # matmuls, recomputed ones included
    recompute_s = work.recompute_flops * (plain / total) / matmul if total else 0.0
    forward_s = work.forward_flops * (plain / total) / matmul if total else 0.0
    backward_s = plain / matmul - forward_s - recompute_s if total else 0.0
    k = setup.grad_accum
    terms = {"matmuls forward": k * forward_s, "matmuls backward": k * backward_s}
    if recompute_s:
        terms["recompute (checkpointing)"] = k * recompute_s
    terms["attention"] = k * attention_s
    terms["memory-bound ops"] = k * memory_s
    fraction = work.forward_flops / total if total else 1 / 3
    whole = forward_s + backward_s + recompute_s + attention_s + memory_s
    forward_window = (forward_s + (attention_s + memory_s) * fraction) if total else whole / 3
    return terms, (forward_window, whole - forward_window)


def _overlap(calls, setup: StepSetup, machine: Machine, forward_s: float, backward_s: float):
    """Exposed seconds per collective over the step, hidden seconds, and calls/bytes per step.

    Per micro-batch: its forward gathers hide behind its forward but the first unit's; its backward gathers and
    the reductions launched in its backward hide behind its backward but the first gather and the last bucket.
    Reductions at the boundary only (DDP's no_sync, ZeRO-1) run in the last micro-batch's backward.
    """
    k = setup.grad_accum
    exposed: dict[str, float] = {}
    hidden: dict[str, float] = {}
    comm: dict[str, dict] = {}
    for boundary in (False, True):
        occurrences = 1 if boundary else k - 1
        if not occurrences:
            continue
        active = [
            c
            for c in calls
            if c.collective.every_micro_step or boundary and c.collective.phase != "after_step"
        ]
        for window, phases in ((forward_s, ("forward",)), (backward_s, ("backward", "backward_gather"))):
            group = [c for c in active if _phase(c, setup) in phases]
            hideable = {c.name: c.seconds - c.seconds / c.calls for c in group}
            total = sum(hideable.values())
            hid = min(total, window * machine.overlap)
            for call in group:
                share = hid * hideable[call.name] / total if total else 0.0
                _add(exposed, call.name, occurrences * (call.seconds - share))
                _add(hidden, call.name, occurrences * share)
        for call in active:
            if _phase(call, setup) in ("backward_blocking", "after_step"):
                _add(exposed, call.name, occurrences * call.seconds)
        for call in active:
            entry = comm.setdefault(call.name, {"calls": 0, "payload_bytes": 0})
            entry["calls"] += occurrences * call.calls
            entry["payload_bytes"] += occurrences * call.payload_bytes
    for call in calls:
        if call.collective.phase == "after_step":
            _add(exposed, call.name, call.seconds)
            comm[call.name] = {"calls": call.calls, "payload_bytes": call.payload_bytes}
    return {f"comm: {name}": value for name, value in exposed.items()}, hidden, comm


def sync_points(calls, setup: StepSetup) -> int:
    """Where a rank waits for its peers in one step: at every call it waits for where it launched it (DeepSpeed
    ZeRO-1/2's blocking reductions; a unit's gather, waited before the unit's forward or backward); once per
    micro-batch for the reductions it launches in backward and waits for at backward's end; once for the
    gathers after the step (back to back: the ranks met at the first). A wait lasts as long as the last peer
    takes to arrive (timing.host_work's per_sync_s), not as many calls as it covers."""
    waits = 0
    for call in calls:
        phase = _phase(call, setup)
        micro_batches = setup.grad_accum if call.collective.every_micro_step else 1
        if phase in ("backward_blocking", "forward", "backward_gather"):
            waits += micro_batches * call.calls
        else:  # backward: one wait per micro-batch it runs in; after_step: one
            waits += micro_batches if phase == "backward" else 1
    return waits


def _phase(call, setup: StepSetup) -> str:
    """The collective's phase on this set-up: a blocking reduction overlaps when the config says overlap_comm."""
    phase = call.collective.phase
    return "backward" if phase == "backward_blocking" and setup.overlap_comm else phase


def _add(table: dict[str, float], key: str, value: float) -> None:
    table[key] = table.get(key, 0.0) + value


def _optimizer_terms(
    shape: ModelShape, spec, setup: StepSetup, machine: Machine, share: float, ranks_on_node: int
) -> dict[str, float]:
    """The gradient clip and the optimizer step over the rank's shard, on the device or offloaded to the host
    (DeepSpeed steps its flat partition in one tensor, the others per parameter: machine.optimizer_rate)."""
    sharding, family = spec.sharding, spec.family
    shard = shape.trainable_params / (1 if sharding == "replicated" else setup.world_size)
    terms = {}
    if not setup.offload_optimizer:  # (offloaded, the host clips beside its optimizer)
        if setup.gradient_clipping:
            clip = shard * constants.GRAD_CLIP_BYTES_PER_PARAM
            terms["gradient clipping"] = clip / (machine.memory_rate("fp32") * 1e9 * share)
        moved = shard * constants.OPTIMIZER_BYTES_PER_PARAM[setup.precision]
        layout = "flat" if family == DEEPSPEED else "foreach"
        terms["optimizer step"] = moved / (machine.optimizer_rate(layout) * 1e9 * share)
        return terms
    host = machine.host_gbps * 1e9
    terms |= {
        "offload: PCIe copies": shard * constants.OFFLOAD_PCIE_BYTES_PER_PARAM[setup.precision] / host,
        "offload: host optimizer": shard / (machine.cpu_adam_params_per_s / ranks_on_node),
    }
    if setup.offload_param:
        element = 4 if setup.precision == "fp32" else 2
        per_rank = shape.num_params / setup.world_size
        terms["offload: parameters over PCIe"] = 2 * setup.grad_accum * per_rank * element / host
    return terms
