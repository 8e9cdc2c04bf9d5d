"""The checks that every engine trains right: finishes, matches DDP, resumes exactly, exports a loadable model,
and (on 2+ ranks) resumes at another world size.

Tolerances, each against the reference run of the same launch (docs/gpu.md#the-acceptance-run-zero-train-gpu-check):
- fp32: every step's loss within FP32_LOSS_TOLERANCE of DDP's (the Trainer peers: of the Trainer's own DDP, whose
  sampler and weight decay they share);
- bf16: within BF16_LOSS_TOLERANCE x DDP's bf16 loss (one bf16 rounding of the loss, 2^-8): the engines keep
  fp32 masters but differ in where they round to bf16;
- resume: the resumed steps' losses equal the uninterrupted run's exactly on CPU ranks; on CUDA within
  FP32_LOSS_TOLERANCE (atomic adds in an embedding's backward make two CUDA runs differ in the last bits);
- export: every exported tensor within EXPORT_TOLERANCE of DDP's export after the same steps.
"""

from __future__ import annotations

import math
import pathlib

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as transformers_logging

from zero_train.acceptance.check import Check, cannot_run, failed, losses, max_gap, within
from zero_train.acceptance.plan import RESUME_STEP, Run, Settings
from zero_train.bench.cells import BENCH_REGISTRY

FP32_LOSS_TOLERANCE = 1e-5
BF16_LOSS_TOLERANCE = 2.0**-8
RESUME_TOLERANCE = {"cpu": 0.0, "cuda": FP32_LOSS_TOLERANCE}
EXPORT_TOLERANCE = 1e-5
ELASTIC_LOSS_TOLERANCE = 1e-5
"""Losses after a resume at another world size (same global batch, other summation order) vs the original."""


def reference_of(engine: str) -> str:
    """The run an engine's losses are held against: DDP's, or for a Trainer peer the Trainer's DDP."""
    bench = BENCH_REGISTRY[engine]
    ddp = "ddp"
    return f"hf-{ddp}" if bench.peer else ddp


def _run_of(runs: list[Run], name: str) -> Run | None:
    return next((run for run in runs if run.name == name), None)


def trains(runs: list[Run], errors: dict, out: pathlib.Path, settings: Settings) -> list[Check]:
    """Per fp32 and bf16 run: it finished, with every step's loss finite."""
    checks = []
    for run in runs:
        if run.kind not in ("fp32", "bf16"):
            continue
        name = f"trains {run.precision}"
        if errors.get(run.name):
            checks.append(failed(name, run.engine, errors[run.name], limit=f"{settings.steps} finite losses"))
            continue
        found = losses(run.paths(out)["metrics"])
        finite = sum(math.isfinite(loss) for loss in found.values())
        checks.append(
            Check(
                name=name,
                engine=run.engine,
                passed=finite == settings.steps,
                value=finite,
                limit=f"{settings.steps} finite losses",
            )
        )
    return checks


def parity(runs: list[Run], errors: dict, out: pathlib.Path) -> list[Check]:
    """Per fp32 and bf16 run (the references left out): its losses against the reference's."""
    checks = []
    for run in runs:
        if run.kind not in ("fp32", "bf16"):
            continue
        reference = _run_of(runs, f"{reference_of(run.engine)}-{run.kind}")
        if reference is None or reference.engine == run.engine:
            continue
        name = f"{run.precision} losses vs {reference.engine}"
        tolerance = FP32_LOSS_TOLERANCE if run.precision == "fp32" else BF16_LOSS_TOLERANCE
        ours, theirs = losses(run.paths(out)["metrics"]), losses(reference.paths(out)["metrics"])
        if errors.get(run.name) or errors.get(reference.name) or not ours or not theirs:
            why = errors.get(run.name) or errors.get(reference.name) or "no losses to compare"
            checks.append(failed(name, run.engine, why, limit=f"<= {tolerance:g}"))
            continue
        gap = max_gap(ours, theirs)
        if run.precision == "bf16":  # relative: one bf16 rounding of the loss
            gap = max(abs(ours[s] - theirs[s]) / abs(theirs[s]) for s in set(ours) & set(theirs))
        complete = set(ours) == set(theirs)
        checks.append(
            within(
                name,
                run.engine,
                gap if complete else None,
                tolerance,
                note="" if complete else "the runs logged different steps",
            )
        )
    return checks


def resume(runs: list[Run], errors: dict, out: pathlib.Path, *, device_kind: str) -> list[Check]:
    """Per resume run: the steps after the step-RESUME_STEP checkpoint equal the uninterrupted run's losses
    (within RESUME_TOLERANCE[device_kind])."""
    name = f"exact resume from step {RESUME_STEP}"
    tolerance = RESUME_TOLERANCE[device_kind]
    return [
        _resumed_vs_original(name, run, runs, errors, out, tolerance) for run in runs if run.kind == "resume"
    ]


def _resumed_vs_original(
    name: str, run: Run, runs: list[Run], errors: dict, out: pathlib.Path, tolerance: float
) -> Check:
    """`run` (resumed from its engine's step-RESUME_STEP checkpoint) against the engine's fp32 run: the losses
    of the steps after RESUME_STEP within `tolerance` (the same steps in both, or failed)."""
    original = _run_of(runs, f"{run.engine}-fp32")
    why = errors.get(run.name) or (errors.get(original.name) if original else "no fp32 run")
    if why:
        return failed(name, run.engine, why, limit=f"<= {tolerance:g}")
    resumed, whole = losses(run.paths(out)["metrics"]), losses(original.paths(out)["metrics"])
    after = {step: loss for step, loss in whole.items() if step > RESUME_STEP}
    gap = max_gap(resumed, after) if set(resumed) == set(after) and after else None
    return within(name, run.engine, gap, tolerance, note=f"steps {sorted(resumed)}")


def export(runs: list[Run], errors: dict, out: pathlib.Path) -> list[Check]:
    """Per resume run: its export loads with transformers and every tensor is within EXPORT_TOLERANCE of DDP's."""
    transformers_logging.disable_progress_bar()  # one bar per export loaded is noise in gpu_check's output

    def load(path: pathlib.Path) -> dict:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        return {name: tensor.detach() for name, tensor in model.state_dict().items()}

    resumes = [run for run in runs if run.kind == "resume"]
    reference = next((run for run in resumes if run.engine == reference_of(run.engine)), None)
    expected = None
    if reference is not None and not errors.get(reference.name):
        expected = load(reference.paths(out)["export"])
    checks = []
    for run in resumes:
        name = "export loads, weights vs ddp's"
        if errors.get(run.name):
            checks.append(failed(name, run.engine, errors[run.name], limit=f"<= {EXPORT_TOLERANCE:g}"))
            continue
        try:
            weights = load(run.paths(out)["export"])
        except (OSError, ValueError, RuntimeError) as err:
            checks.append(failed(name, run.engine, f"does not load: {str(err).splitlines()[0]}"))
            continue
        if expected is None:
            checks.append(
                failed(name, run.engine, "the ddp export did not load", limit=f"<= {EXPORT_TOLERANCE:g}")
            )
            continue
        if set(weights) != set(expected):
            checks.append(
                failed(name, run.engine, f"tensors differ: {sorted(set(weights) ^ set(expected))[:3]}")
            )
            continue
        gap = max(float((weights[key] - expected[key]).abs().max()) for key in expected)
        checks.append(within(name, run.engine, gap, EXPORT_TOLERANCE, note=f"{len(weights)} tensors"))
    return checks


def elastic(
    runs: list[Run],
    elastic_runs: list[Run],
    errors: dict,
    out: pathlib.Path,
    *,
    world_size: int,
    why_not: str,
) -> list[Check]:
    """Per engine: its step-RESUME_STEP checkpoint resumed at another world size, losses vs the original run's.

    Args:
        why_not: when no elastic run could be made (one rank, one GPU), the reason each check lists.
    """
    name = f"resume at {world_size} rank(s)" if elastic_runs else "resume at another world size"
    if not elastic_runs:
        engines = [run.engine for run in runs if run.kind == "resume"]
        return [
            cannot_run(name, engine, why_not, limit=f"<= {ELASTIC_LOSS_TOLERANCE:g}") for engine in engines
        ]
    return [
        _resumed_vs_original(name, run, runs, errors, out, ELASTIC_LOSS_TOLERANCE) for run in elastic_runs
    ]
