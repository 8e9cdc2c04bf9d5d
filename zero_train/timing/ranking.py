"""`zero-train plan`'s set-ups that fit, ranked by predicted time to train the requested tokens.

    ranked = rank_plan(request, preset_machine("h100-sxm"), tokens=1e9)
    ranked[0].candidate.setup.name, ranked[0].step.seconds, ranked[0].hours, ranked[1].slower_by, ranked[1].why

Every set-up of memory.model.plan is evaluated (its largest micro-batch that fits, as the memory plan picks it),
each that fits gets its step time (step.step_time, on the same activation count and the same DeepSpeed JSON
the plan writes), and they are sorted by hours for `tokens`. A runner-up says how much slower it is than the
first and which term makes most of the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_train.memory.model.plan import (
    ActivationCounts,
    Candidate,
    Plan,
    PlanRequest,
    evaluate,
    setup_config,
    setup_order,
)
from zero_train.timing.constants import DEEPSPEED_DEFAULT_BUCKET_ELEMENTS as DEFAULT_BUCKET
from zero_train.timing.machine import Machine
from zero_train.timing.step import StepSetup, StepTime, step_time


@dataclass(kw_only=True, slots=True)
class RankedSetup:
    """One set-up that fits, with its predicted time."""

    # Documented fields, the shape of checkpoint.save.SaveOptions: a dataclass's, not shared logic.

    candidate: Candidate
    step: StepTime | None = None
    """None where no machine was given (the memory plan's order only)."""
    hours: float = 0.0
    """To train the requested tokens."""
    slower_by: float = 0.0
    """Hours / the first's hours - 1 (0 for the first)."""
    why: str = ""
    """The term that adds most to this set-up's step against the first's, e.g. "recompute (checkpointing)
    +0.21 s"."""


def step_setup(request: PlanRequest, candidate: Candidate) -> StepSetup:
    """The StepSetup of a plan's candidate (its DeepSpeed JSON's reduce bucket and overlap_comm)."""
    setup = candidate.setup
    zero = setup_config(request, setup, candidate.micro_batch_size, candidate.grad_accum).get(
        "zero_optimization", {}
    )
    # One keyword per field, as memory.model.peak's PeakModel.as_dict: another record, nothing to share.
    return StepSetup(
        engine=setup.engine,
        world_size=request.world_size,
        gpus_per_node=request.gpus_per_node,
        micro_batch_size=candidate.micro_batch_size,
        block_size=request.block_size,
        grad_accum=candidate.grad_accum,
        gradient_checkpointing=setup.checkpointing,
        precision=request.precision,
        offload_optimizer=setup.offload_optimizer,
        offload_param=setup.offload_param,
        bucket_elements=int(zero.get("reduce_bucket_size") or DEFAULT_BUCKET),
        overlap_comm=zero.get("overlap_comm"),
    )


def rank_plan(
    request: PlanRequest, machine: Machine, *, tokens: float, engines: tuple[str, ...] | None = None
) -> tuple[list[RankedSetup], Plan]:
    """Every fitting set-up, fastest first, and the memory plan they came from (its `rejected`: what does not fit).

    Raises:
        ValueError: nothing fits (memory.model.plan's message).
    """
    counts = ActivationCounts(request)
    fitting, rejected = [], []
    for setup in setup_order():
        if engines is None or setup.engine in engines:
            candidate = evaluate(request, setup, counts)
            (fitting if candidate.fits else rejected).append(candidate)
    if not fitting:
        last = rejected[-1] if rejected else None
        raise ValueError(
            f"no set-up fits: even {last.setup.name} needs {last.reason}; "
            "use more GPUs, more memory, or a shorter --block-size"
        )
    ranked = []
    for candidate in fitting:
        count = counts.get(candidate.micro_batch_size, candidate.setup.checkpointing)
        step = step_time(request.shape, count, step_setup(request, candidate), machine)
        ranked.append(RankedSetup(candidate=candidate, step=step, hours=step.hours_for(tokens)))
    ranked.sort(key=lambda row: row.hours)
    for row in ranked[1:]:
        row.slower_by = row.hours / ranked[0].hours - 1
        row.why = difference(ranked[0].step, row.step)
    plan = Plan(request=request, fitting=[row.candidate for row in ranked], rejected=rejected)
    return ranked, plan


def difference(first: StepTime, other: StepTime) -> str:
    """The term that costs `other` most against `first`, per token (steps differ in tokens)."""
    scale = first.tokens_per_step / other.tokens_per_step
    names = {*first.terms, *other.terms}
    deltas = {name: other.terms.get(name, 0.0) * scale - first.terms.get(name, 0.0) for name in names}
    name = max(deltas, key=lambda key: deltas[key])
    return f"{name} +{deltas[name]:.3g} s" if deltas[name] > 0 else "fewer tokens per step"
