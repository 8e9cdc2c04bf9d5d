"""Why a rank ran out of memory, and the cheapest change that fits: one line from the rank's record.

The record is the rank's heartbeat (zero_train.runtime.vitals): the run's settings (`run`), the phase it was in,
the limit that binds it (zero_train.runtime.memory_limit) and what it used of it when the run started. What the
run's tensors may use is that limit less the start (the interpreter and libraries; on a GPU the whole GPU, the
margin of zero_train.memory.model.gpu_terms then kept free by the plan). The line names

- the rank and the phase (forward and backward of a step, its optimizer step, the engine's set-up, ...);
- the largest term of our estimate (zero_train.memory.model.estimate) in that phase, against what it had;
- the first set-up of `zero-train plan`'s own search (zero_train.memory.model.plan) that fits in it: the same
  engine with a smaller micro-batch (more accumulation, the same global batch), then with activation
  checkpointing, then every set-up the plan tries, cheapest first, e.g. "--gradient-checkpointing: predicted
  0.21 GB per rank".

When our estimate of the run itself fits what the rank had (the estimate missed), the search asks for 10% less
than that estimate, and the line says so.
"""

from __future__ import annotations

import dataclasses

from zero_train.hf.lora import LoraSpec
from zero_train.hf.models import model_config
from zero_train.memory.model import plan
from zero_train.memory.model.engine_estimate import estimate_engine
from zero_train.memory.model.offload import OffloadSettings
from zero_train.memory.model.peak import TERM_WORDS
from zero_train.memory.model.plan import PlanRequest, evaluate, setup_order
from zero_train.memory.model.theory import model_shape
from zero_train.registry import DEEPSPEED, engine_spec

GB = 1e9
MISSED_FRACTION = 0.9
"""Our estimate fitted, yet the rank ran out: search below this fraction of it."""
PHASE_WORDS = {
    "data": "preparing the data",
    "model_built": "building the model",
    "engine_initialized": "setting up the engine",
    "forward": "forward and backward",
    "step": "the optimizer step",
    "evaluation": "evaluation",
    "checkpoint": "saving a checkpoint",
    "export": "exporting the model",
}
TRAINING_PHASES = {"forward": ("forward", "backward_start", "backward_end"), "step": ("step",)}
"""The run's phases (zero_train.train.loop) -> the peak model's (zero_train.memory.model.peak.PHASES)."""


@dataclasses.dataclass(kw_only=True, slots=True)
class Explanation:
    """What the line says, as values (tests and `zero-train explain --json` read them)."""

    rank: int
    phase: str
    had_bytes: int
    limit_kind: str
    predicted_bytes: int
    term: str
    term_bytes: int
    change: str | None
    change_bytes: int | None

    def line(self) -> str:
        """The one line: "rank 1 ran out of memory in ..."."""
        return f"rank {self.rank} ran out of memory {self.detail()}"

    def detail(self) -> str:
        """The line after "rank N ran out of memory ": where, the largest term, the change."""
        had = f"{_gb(self.had_bytes)} it had ({self.limit_kind})"
        text = (
            f"in {self.phase}: {TERM_WORDS.get(self.term, self.term)} {_gb(self.term_bytes)} of the {had}, "
            f"the largest term of our estimate ({_gb(self.predicted_bytes)} per rank)"
        )
        if self.predicted_bytes <= self.had_bytes:
            text += f"; our estimate fits, so it missed: searched below {MISSED_FRACTION:.0%} of it"
        if self.change is None:
            return text + "; nothing `zero-train plan` tries fits: more memory or more ranks"
        return (
            text + f"; cheapest change that fits: {self.change}: predicted {_gb(self.change_bytes)} per rank"
        )


def _gb(num_bytes: float) -> str:
    return f"{num_bytes / GB:.3g} GB"


def available_bytes(record: dict) -> int:
    """What the run's tensors had: the limit less the rank's use at the start (all of a GPU)."""
    limit = record["limit"]
    return int(limit["bytes"] - limit.get("start_used_bytes", 0))


def phase_words(phase: dict | None, grad_accum: int = 1) -> str:
    """The words of a phase record: "forward and backward of step 3 (micro-batch 2 of 4)", ..."""
    if not phase:
        return "an unknown phase"
    words = PHASE_WORDS.get(phase["name"], phase["name"])
    if phase.get("step"):
        words += f" of step {phase['step']}"
    if phase.get("micro_batch") and grad_accum > 1:
        words += f" (micro-batch {phase['micro_batch']} of {grad_accum})"
    return words


def explain(record: dict) -> Explanation:
    """The explanation of a rank's out-of-memory end from its record (it has `run` and `limit`)."""
    run = record["run"]
    request, setup = (
        _request(run, record),
        plan.Setup(engine=run["engine"], checkpointing=run["checkpointing"]),
    )
    counts = plan.ActivationCounts(request)
    current = _estimate(request, setup, run, counts)
    phase = record.get("phase") or {}
    terms = _phase_terms(current, phase.get("name", ""))
    if (
        phase.get("step") == 1
        and phase["name"] == "forward"
        and engine_spec(run["engine"]).family != DEEPSPEED
    ):
        terms.pop("optimizer_states", None)  # torch's optimizers create their states in the first step
    term = max(terms, key=lambda name: terms[name])
    had = available_bytes(record)
    target = had if current.device_peak_bytes > had else int(MISSED_FRACTION * current.device_peak_bytes)
    request = dataclasses.replace(request, headroom=_headroom(request, target))
    counts.request = request
    found = _cheapest(request, setup, run, counts)
    return Explanation(
        rank=record["rank"],
        phase=phase_words(record.get("phase"), run["grad_accum"]),
        had_bytes=had,
        limit_kind=record["limit"]["kind"],
        predicted_bytes=current.device_peak_bytes,
        term=term,
        term_bytes=terms[term],
        change=_change_words(found, run) if found else None,
        change_bytes=found.device_bytes if found else None,
    )


def _request(run: dict, record: dict):
    config = model_config(run["model"], vocab_size=run.get("vocab_size"))
    lora = run.get("lora")
    spec = (
        None
        if not lora
        else LoraSpec(
            r=lora["r"],
            alpha=lora.get("alpha", 8.0),
            target_modules=tuple(lora["target_modules"]) if lora.get("target_modules") else None,
        )
    )
    world = run["world_size"]
    gpu_memory = record["limit"]["bytes"] if run["device"] == "cuda" else max(available_bytes(record), 1)
    return PlanRequest(
        shape=model_shape(config, spec),
        config=config,
        nodes=1,
        gpus_per_node=world,
        gpu_memory_gb=gpu_memory / GB,
        host_memory_gb=max(run.get("host_memory_bytes", 0), gpu_memory * world) / GB,
        global_batch_size=run["micro_batch_size"] * run["grad_accum"] * world,
        block_size=run["block_size"],
        precision=run["precision"],
        load_dtype=run.get("load_dtype", "fp32"),
        backend="nccl" if run["device"] == "cuda" else "gloo",
        lora=spec,
    )


def _estimate(request, setup, run: dict, counts):
    """Our estimate of the run as it ran: its own DeepSpeed config, micro-batch and accumulation."""
    ds_config = run.get("ds_config")
    return estimate_engine(
        setup.engine,
        request.shape,
        counts.get(run["micro_batch_size"], setup.checkpointing),
        request.world_size,
        per_node=request.gpus_per_node,
        usable_gpu_bytes=None,
        host_memory_bytes=None,
        deepspeed_peer=False,
        settings=OffloadSettings.from_config(ds_config),
        device=run["device"],
        precision=run["precision"],
        micro_batch_size=run["micro_batch_size"],
        block_size=run["block_size"],
        grad_accum=run["grad_accum"],
        gradient_checkpointing=setup.checkpointing,
        ds_config=ds_config,
        load_dtype=request.load_dtype,
    )


def _phase_terms(estimate, phase: str) -> dict[str, int]:
    """The terms of the peak model's phase the run's `phase` falls in (its highest), else the states at rest."""
    names = TRAINING_PHASES.get(phase)
    if names is None:  # set-up, evaluation, a save: what the engine holds between steps
        return {name: value for name, value in estimate.boundary.items() if name != "activations" and value}
    highest = max(names, key=lambda name: sum(estimate.device_phases[name].values()))
    return {name: value for name, value in estimate.device_phases[highest].items() if value}


def _headroom(request, target: int) -> float:
    """The plan's --headroom that leaves `target` bytes usable (the GPU margin still kept)."""
    total = request.gpu_memory_gb * GB
    return min(max(1 - (target + sum(request.margin.values())) / total, 0.0), 0.999)


def _cheapest(request, current, run: dict, counts):
    """The first fitting candidate: the run's engine (micro-batch split, then checkpointing), then the plan's."""
    own = [current, dataclasses.replace(current, checkpointing=True)]
    for setup in dict.fromkeys([*own, *setup_order()]):
        if run["device"] != "cuda" and (setup.offload_optimizer or setup.offload_param):
            continue  # on CPU ranks the host is the device: offload moves nothing off it
        candidate = evaluate(request, setup, counts)
        if candidate.fits and (setup != current or candidate.micro_batch_size < run["micro_batch_size"]):
            return candidate
    return None


def _change_words(candidate, run: dict) -> str:
    """The flags that change the run into `candidate`, with the set-up's name when the engine changes."""
    setup, flags = candidate.setup, []
    if setup.engine != run["engine"]:
        flags.append(f"--engine {setup.engine}")
    if setup.checkpointing and not run["checkpointing"]:
        flags.append("--gradient-checkpointing")
    if candidate.micro_batch_size != run["micro_batch_size"]:
        flags.append(f"--micro-batch-size {candidate.micro_batch_size} --grad-accum {candidate.grad_accum}")
    if setup.offload_optimizer:
        flags.append("offload_optimizer cpu" + (" and offload_param cpu" if setup.offload_param else ""))
    words = " ".join(flags)
    return f"{words} ({setup.name})" if setup.engine != run["engine"] else words


def closeness(record: dict) -> str:
    """For a rank that finished: its highest use against what it had, and our estimate's peak beside it."""
    limit = record["limit"]
    peak = record.get("peak_used_bytes", 0)
    if limit["measure"] == "VmRSS":
        peak = max(peak, record.get("peak_rss_bytes", 0))  # the kernel's high-water mark, not a sample
    peak -= limit.get("start_used_bytes", 0)
    had = available_bytes(record)
    return (
        f"rank {record['rank']} finished: the run reached {_gb(peak)} of the {_gb(had)} it had "
        f"({limit['kind']}, {peak / had:.0%} of it; our estimate {_gb(predicted_peak(record))})"
    )


def predicted_peak(record: dict) -> int:
    """Our estimate's peak per rank for the run of `record`."""
    run = record["run"]
    request, setup = (
        _request(run, record),
        plan.Setup(engine=run["engine"], checkpointing=run["checkpointing"]),
    )
    return _estimate(request, setup, run, plan.ActivationCounts(request)).device_peak_bytes


def kept_record_line(record: dict) -> str:
    """What `zero-train explain` says of one rank's kept record (zero_train.runtime.vitals.keep_in)."""
    outcome, rank = record.get("outcome"), record["rank"]
    if (
        record.get("ended") != "exit"
    ):  # its Python never exited: killed (the OOM killer's SIGKILL, most likely)
        return (
            f"rank {rank} ended without Python's exit (killed; most likely out of memory): "
            + explain(record).detail()
        )
    if outcome == "finished":
        return closeness(record)
    if outcome and " ran out of memory " in outcome:
        return outcome
    return f"rank {rank} did not finish ({outcome or 'no outcome recorded'})"
