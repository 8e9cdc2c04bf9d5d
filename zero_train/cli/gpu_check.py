"""`zero-train gpu-check`: the acceptance run that asserts, sized to the machine; exit 1 when a check fails.

    zero-train gpu-check --out runs/gpu_check           # every GPU this machine has (world size 1 on one GPU)
    zero-train gpu-check --cpu --out runs/gpu_check     # gloo ranks, the tiny model, 2 ranks (CI runs this)
    bash scripts/gpu_check.sh                           # the same, installing the wheel folder first

Every engine of zero_train.registry (and the Hugging Face Trainer peers the bench compares) trains the same
model, data and seed in ONE launch of ranks: fp32 losses against DDP's, bf16 within one bf16 rounding, an exact
resume, an export that loads with transformers and matches DDP's, the measured peak against `estimate`, the GPU
margin's terms beside what `estimate` assumes, step time, tokens/s, MFU and the ratios docs/bench.md targets;
on 2+ ranks the checkpoints are resumed at one rank. Writes OUT/gpu_check.json and OUT/gpu_check.md
(docs/gpu.md says what ran where).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from zero_train.cli.commands import COMMANDS
from zero_train.launch.command import RANK_LAUNCHERS
from zero_train.runtime.parser import positive_float, positive_int


def gpu_check_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `gpu-check` with its flags."""
    parser = subparsers.add_parser(
        "gpu-check",
        help=COMMANDS["gpu-check"],
        description="Train every engine in one launch and assert parity, resume, export, memory against the "
        "estimate; measure the GPU margin and speed. Writes OUT/gpu_check.json and OUT/gpu_check.md; exit 1 when "
        "any check fails.",
    )
    add = parser.add_argument
    add(
        "--out", required=True, type=pathlib.Path, metavar="DIR", help="where runs, gpu_check.json and .md go"
    )
    add("--cpu", action="store_true", help="gloo ranks on the CPU (the tiny model, 2 ranks) even with a GPU")
    add("--model", default=None, help="the preset trained (default: tiny on CPU ranks, gpt2-25m on GPUs)")
    add(
        "--steps", type=positive_int, default=4, help="optimizer steps per run (>= 3: the resume starts at 2)"
    )
    add("--launcher", choices=RANK_LAUNCHERS, default="torchrun", help="how ranks are started")
    add(
        "--timeout",
        type=positive_float,
        default=600.0,
        metavar="S",
        help="stop a launch in which no run finished for S seconds",
    )
    add(
        "--checks-only",
        action="store_true",
        help="check the runs already in --out (an earlier gpu-check) without launching any",
    )
    parser.set_defaults(func=gpu_check_command, uses_deepspeed=False)
    return parser


def gpu_check_command(args: argparse.Namespace) -> int:
    """Run the check; print the Markdown; 0 when every asserted check passed, else 1."""
    from zero_train.runtime.errors import UsageError

    if args.steps < 3:
        raise UsageError(
            f"--steps {args.steps}: the resume check needs at least 3 steps (it resumes at step 2)"
        )
    if args.checks_only and not (args.out / "runs").is_dir():
        raise UsageError(
            f"--checks-only: {args.out} holds no runs/ of an earlier gpu-check; run it without the flag"
        )
    import torch

    if not args.cpu and not torch.cuda.is_available():
        raise UsageError(
            "gpu-check: torch sees no CUDA GPU here (nothing was run); run it on a GPU machine, or pass --cpu "
            "for the same checks on gloo ranks"
        )
    from zero_train.acceptance.run import Options, acceptance_run

    options = Options(
        out=args.out,
        cpu=args.cpu,
        model=args.model,
        steps=args.steps,
        launcher=args.launcher,
        timeout_s=args.timeout,
        checks_only=args.checks_only,
    )
    result = acceptance_run(options)
    print((args.out / "gpu_check.md").read_text())
    print(f"-> {args.out / 'gpu_check.json'}, {args.out / 'gpu_check.md'}", file=sys.stderr)
    return 1 if result["failed"] else 0
