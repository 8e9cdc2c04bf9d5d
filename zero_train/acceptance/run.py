"""The acceptance run end to end: set up, run the plans, check, write DIR/gpu_check.json and DIR/gpu_check.md.

    result = acceptance_run(Options(out=pathlib.Path("runs/gpu_check"), cpu=True))
    result["failed"]                   # 0: every assert passed

Every run trains one model folder written here first (the preset's seeded weights, save_pretrained): each
engine then starts from the same weights, DeepSpeed ZeRO-3 included (under zero.Init a preset's random
initialisation draws other numbers; a pretrained folder loads the same ones).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import sys
import time
from dataclasses import dataclass

from zero_train.acceptance import measures, training
from zero_train.acceptance.check import Check
from zero_train.acceptance.launch import run_plan
from zero_train.acceptance.machine import machine_facts, measure_fixed_terms
from zero_train.acceptance.markdown import render
from zero_train.acceptance.plan import Settings, elastic_runs, main_runs
from zero_train.hf.models import load_tokenizer, seeded_model

OFFLINE_ENV = dict(ZT_OFFLINE="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
"""The check needs no network: every run's model, tokenizer and corpus are local."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Options:
    """`zero-train gpu-check`'s flags."""

    out: pathlib.Path
    cpu: bool = False
    """Gloo ranks on the CPU (the tiny model, 2 ranks) even where a GPU is seen."""
    model: str | None = None
    """The preset trained; None: tiny on CPU ranks, gpt2-25m on GPUs."""
    steps: int = 4
    launcher: str = "torchrun"
    timeout_s: float = 600.0
    """A launch without a finished run for this long is stopped."""
    checks_only: bool = False
    """Check the runs already in `out` (from an earlier gpu-check) without launching any."""


def write_model_folder(preset: str, folder: pathlib.Path) -> None:
    """The preset's seeded weights and the offline tokenizer as a save_pretrained folder (seed 0, as train.py)."""
    if (folder / "config.json").is_file():
        return

    tokenizer = load_tokenizer()
    seeded_model(preset, seed=0, vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def acceptance_run(options: Options) -> dict:
    """Run (or with checks_only, re-check) the acceptance run; returns gpu_check.json's content."""
    for name, value in OFFLINE_ENV.items():
        os.environ.setdefault(name, value)
    facts = machine_facts(cpu=options.cpu)
    os.environ["ZT_DEVICE"] = facts["kind"]  # a rank that cannot use it fails with one line, not a CPU run
    started = time.perf_counter()
    out = options.out
    for sub in ("configs", "runs", "logs", "export", "ckpt"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    preset = options.model or ("tiny" if facts["kind"] == "cpu" else "gpt2-25m")
    write_model_folder(preset, out / "model")
    settings = Settings(
        model=str(out / "model"),
        world_size=facts["world_size"],
        steps=options.steps,
        micro_batch_size=2,
        block_size=64,
        out=out,
    )
    precisions = ("fp32", "bf16") if facts.get("bf16", True) else ("fp32",)
    runs = main_runs(settings, precisions=precisions)
    elastic = elastic_runs(settings, world_size=1) if facts["world_size"] >= 2 else []
    process_terms = None
    if facts["kind"] == "cuda":
        process_terms = measure_fixed_terms()
    if options.checks_only:
        errors = _errors_on_file(runs + elastic, out)
    else:
        launch = dict(launcher=options.launcher, timeout_s=options.timeout_s)
        print(
            f"gpu-check: {len(runs)} runs in one launch of {facts['world_size']} rank(s) on {facts['device']}, "
            f"then {len(elastic)} at 1 rank (logs: {out / 'logs'})",
            file=sys.stderr,
        )
        errors = run_plan(runs, out, world_size=facts["world_size"], label="main", **launch)
        if elastic:
            errors.update(run_plan(elastic, out, world_size=1, label="elastic", **launch))
    why_not = "one GPU: NCCL will not run two ranks on one device"
    checks = check_all(runs, elastic, errors, out, settings, facts, process_terms, why_not)
    result = dict(
        schema="zero_train.gpu_check/1",
        device=facts["device"],
        machine=facts,
        model=preset,
        world_size=facts["world_size"],
        started=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        wall_s=time.perf_counter() - started,
        failed=sum(check.passed is False and check.kind == "assert" for check in checks),
        checks=[check.as_dict() for check in checks],
    )
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "gpu_check.md").write_text(render(result))
    return result


def check_all(runs, elastic, errors, out, settings, facts, process_terms, why_not) -> list[Check]:
    """Every check, in the order gpu_check.md lists them."""
    checks = training.trains(runs, errors, out, settings)
    checks += training.parity(runs, errors, out)
    checks += training.resume(runs, errors, out, device_kind=facts["kind"])
    checks += training.export(runs, errors, out)
    checks += training.elastic(runs, elastic, errors, out, world_size=1, why_not=why_not)
    peak_checks, rows = measures.peaks(runs, errors, out, sampled=facts["kind"] == "cpu")
    checks += peak_checks
    checks += measures.traffic(runs, rows, world_size=facts["world_size"])
    checks += measures.margin(runs, errors, out, rows, process_terms)
    checks += measures.speed(runs, errors, out, facts.get("gpu_name"))
    return checks


def _errors_on_file(runs, out: pathlib.Path) -> dict:
    """{run: None if its done file is there, else why not} for --checks-only."""
    return {run.name: None if run.paths(out)["done"].is_file() else "not run (no done file)" for run in runs}
