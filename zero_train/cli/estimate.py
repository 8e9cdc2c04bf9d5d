"""`zero-train estimate`: per-rank memory for ZeRO stages 0-3 before launching, and which stages fit.

"ours" is our PEAK model (zero_train.memory.model.peak): the most one rank holds in any phase of a step, which
is what must fit; the paper and DeepSpeed's estimators count model states only.

zero-train estimate --params 7.5e9 --world-size 64                 # the paper: 120 / 31.4 / 16.6 / 1.88 GB
zero-train estimate --model gpt2-small --world-size 8 --gpu-memory 16 --micro-batch-size 4
zero-train estimate --model tiny --world-size 2 --config ds_configs/zero2.json --json
"""

from __future__ import annotations

import argparse
import json
import math

from zero_train.runtime.errors import UsageError
from zero_train.runtime.parser import positive_float, positive_int

STAGE_NAMES = {0: "DDP (stage 0)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
STAGE_ENGINES = {0: "ddp", 1: "ds1", 2: "ds2", 3: "ds3"}  # "ours" models torch DDP and DeepSpeed's stages


def estimate_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `estimate` with its flags."""
    parser = subparsers.add_parser(
        "estimate",
        help="per-rank memory of ZeRO stages 0-3: paper, DeepSpeed's estimator, ours; which fit",
        description="Per-rank bytes for ZeRO stages 0-3 from (a) the ZeRO paper's formulas, (b) DeepSpeed's "
        "own estimators (model states only), (c) our model of the PEAK over a training step: model states as "
        "the engines hold them plus communication buckets (from --config), activations (from --model, "
        "--micro-batch-size, --block-size), gradients before they are reduced, fp32 gradient copies and "
        "optimizer temporaries. GB = 1e9 bytes.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a preset (tiny, gpt2-small, ...), a local HF folder or a hub id")
    source.add_argument("--params", type=positive_float, help="a raw parameter count instead, e.g. 7.5e9")
    parser.add_argument("--world-size", type=positive_int, required=True, help="data-parallel ranks")
    parser.add_argument("--config", help="a DeepSpeed config (bucket sizes, precision)")
    parser.add_argument(
        "--precision", choices=("fp32", "bf16", "fp16"), default=None, help="default: the config's, else bf16"
    )
    parser.add_argument(
        "--gpu-memory", type=positive_float, help="memory per rank in GB: say which stages fit"
    )
    parser.add_argument(
        "--micro-batch-size", type=positive_int, default=1, help="for activations (default 1)"
    )
    parser.add_argument(
        "--block-size", type=positive_int, help="tokens per sample (default: the model's context)"
    )
    parser.add_argument(
        "--grad-accum", type=positive_int, default=1, help="micro-batches per optimizer step (default 1)"
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="activation checkpointing (scripts/train.py --gradient-checkpointing)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="where the ranks run (cpu: gloo collectives, whose all-gather allocates a flat buffer); default cuda",
    )
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.set_defaults(func=estimate_command)
    return parser


def _precision(args: argparse.Namespace, ds_config: dict | None) -> str:
    if ds_config is None:
        return args.precision or "bf16"
    from zero_train.ds_config.parse import precision_of

    config_precision = precision_of(ds_config)
    if args.precision and args.precision != config_precision:
        raise UsageError(
            f"--precision {args.precision} disagrees with {args.config} ({config_precision}); drop one of them"
        )
    return config_precision


def _shape_and_block(args: argparse.Namespace):
    from zero_train.memory.model.theory import ModelShape, model_shape

    if args.params is not None:
        if args.block_size:
            raise UsageError("--block-size needs --model (activations come from the model's shape)")
        return ModelShape(num_params=int(args.params)), 0
    from zero_train.hf.models import max_context, model_config

    config = model_config(args.model)
    block_size = args.block_size or max_context(config)
    if block_size > max_context(config):
        raise UsageError(f"--block-size {block_size} exceeds {args.model}'s context ({max_context(config)})")
    return model_shape(config), block_size


def _stage_row(
    stage: int, shape, args: argparse.Namespace, precision: str, block_size: int, ds_config
) -> dict:
    """One stage: the paper, DeepSpeed's estimator and our peak model (with its phases)."""
    from zero_train.memory.model import theory
    from zero_train.memory.model.deepspeed_estimate import deepspeed_estimate
    from zero_train.memory.model.peak import backend_for, engine_peak

    model = engine_peak(
        STAGE_ENGINES[stage], shape, args.world_size, precision=precision,
        micro_batch_size=args.micro_batch_size, block_size=block_size, ds_config=ds_config,
        backend=backend_for(args.device), grad_accum=args.grad_accum,
        gradient_checkpointing=args.gradient_checkpointing,
    )  # fmt: skip
    return dict(
        stage=stage,
        paper_bytes=theory.paper_bytes(shape.num_params, args.world_size, stage, precision=precision),
        deepspeed_bytes=deepspeed_estimate(
            shape.num_params, args.world_size, stage, largest_layer_params=shape.largest_layer_params
        ),
        ours_bytes=model.peak_bytes,
        ours_peak_phase=model.peak_phase,
        ours_phases=model.phases,
        ours_categories=model.boundary,
    )


def build_estimate(args: argparse.Namespace) -> dict:
    """All numbers of the estimate, as the --json output.

    Returns:
        {"num_params", "world_size", "precision", "micro_batch_size", "block_size", "grad_accum",
         "gradient_checkpointing", "device",
         "gpu_memory_bytes", "stages": [{"stage", "paper_bytes", "deepspeed_bytes", "ours_bytes" (our
         predicted peak), "ours_peak_phase", "ours_phases" ({phase: {term: bytes}}), "ours_categories"
         (our categories at the step boundary + activations), "fits"}], "recommended_stage", "notes"}
    """
    from zero_train.memory.model import theory

    ds_config = None
    if args.config:
        from zero_train.ds_config import load_config

        ds_config = load_config(args.config)
    precision = _precision(args, ds_config)
    shape, block_size = _shape_and_block(args)
    capacity = int(args.gpu_memory * theory.GB) if args.gpu_memory else None
    stages = []
    for stage in theory.STAGES:
        row = _stage_row(stage, shape, args, precision, block_size, ds_config)
        row["fits"] = None if capacity is None else row["ours_bytes"] <= capacity
        stages.append(row)
    fitting = [s["stage"] for s in stages if s["fits"]]
    return dict(
        num_params=shape.num_params,
        world_size=args.world_size,
        precision=precision,
        micro_batch_size=args.micro_batch_size,
        block_size=block_size,
        grad_accum=args.grad_accum,
        gradient_checkpointing=args.gradient_checkpointing,
        device=args.device,
        gpu_memory_bytes=capacity,
        stages=stages,
        recommended_stage=fitting[0] if fitting else None,
        notes=_notes(args, precision, shape),
    )


def _notes(args: argparse.Namespace, precision: str, shape) -> list[str]:
    notes = [
        "ours = our predicted PEAK per rank (zero_train.memory.model.peak): the largest of the end of forward, the "
        "start and the end of backward and the optimizer step; the paper and DeepSpeed count model states only",
        "stage 0 is torch DDP, stages 1-3 DeepSpeed ZeRO-1/2/3; ZeRO-1 holds whole gradients during backward "
        "(as the paper counts them) and only its partition at the step boundary",
        "DeepSpeed has no estimator for stages 0 and 1 (only estimate_zero2/zero3_model_states_mem_needs)",
    ]
    if precision == "fp32":
        notes.append("DeepSpeed's estimators assume mixed precision (18 bytes/param sharded) even for fp32")
    if args.params is not None:
        notes.append(
            "--params: activations, the loss's tensors and the largest tensor (AdamW's temporaries, DeepSpeed's "
            "ZeRO-3 estimator) not counted (give --model)"
        )
    if not args.config:
        notes.append(
            "no --config: DeepSpeed's defaults assumed (reduce bucket 5e8 elements, FusedAdam: no optimizer "
            "temporaries)"
        )
    return notes


def _gb(value: float | None, unit: float = 1e9) -> str:
    """Three significant digits without exponents: 120, 31.4, 1.88, 1,010."""
    if value is None:
        return "-"
    scaled = value / unit
    decimals = max(0, 2 - math.floor(math.log10(scaled))) if scaled > 0 else 0
    return f"{scaled:,.{decimals}f}"


def _phase_line(row: dict, unit: float) -> str:
    """The terms of one stage's peak phase, largest first (the few that matter)."""
    from zero_train.memory.model.peak import TERM_WORDS

    terms = sorted(row["ours_phases"][row["ours_peak_phase"]].items(), key=lambda item: -item[1])
    words = ", ".join(f"{TERM_WORDS.get(name, name)} {_gb(value, unit)}" for name, value in terms[:5])
    more = f", + {len(terms) - 5} smaller" if len(terms) > 5 else ""
    return f"  {STAGE_NAMES[row['stage']]} peaks at {row['ours_peak_phase']}: {words}{more}"


def _print_table(result: dict) -> None:
    unit, unit_name = (1e9, "GB") if result["stages"][0]["paper_bytes"] >= 1e9 else (1e6, "MB")
    exponent = 9 if unit_name == "GB" else 6
    block = (
        f"micro-batch {result['micro_batch_size']} x block {result['block_size']}"
        if result["block_size"]
        else ""
    )
    print(
        f"{result['num_params']:,} params, {result['world_size']} ranks, {result['precision']}"
        f"{', ' + block if block else ''}; {unit_name} per rank (1 {unit_name} = 1e{exponent} bytes)"
    )
    header = f"{'stage':<14} {'paper':>8} {'DeepSpeed':>10} {'ours':>8} {'peak phase':<15} {'states':>8}"
    print(header + ("  fits" if result["gpu_memory_bytes"] else ""))
    for row in result["stages"]:
        cats = row["ours_categories"]
        states = sum(cats[name] for name in ("params", "grads", "master_params", "optimizer_states"))
        line = (
            f"{STAGE_NAMES[row['stage']]:<14} {_gb(row['paper_bytes'], unit):>8} "
            f"{_gb(row['deepspeed_bytes'], unit):>10} {_gb(row['ours_bytes'], unit):>8} "
            f"{row['ours_peak_phase']:<15} {_gb(states, unit):>8}"
        )
        print(line + ("" if row["fits"] is None else f"  {'yes' if row['fits'] else 'no'}"))
    print("ours = predicted peak; states = our model states at the step boundary; in each peak phase:")
    for row in result["stages"]:
        print(_phase_line(row, unit))
    for note in result["notes"]:
        print(f"note: {note}")
    if result["gpu_memory_bytes"] is None:
        print("give --gpu-memory GB to see which stages fit")
    elif result["recommended_stage"] is None:
        print(
            f"nothing fits in {_gb(result['gpu_memory_bytes'])} GB: add ranks, offload, or shrink the micro-batch"
        )
    else:
        stage = result["recommended_stage"]
        print(
            f"recommended: {STAGE_NAMES[stage]}, the lowest stage that fits (least communication and complexity)"
        )


def estimate_command(args: argparse.Namespace) -> int:
    """Print the estimate as a table (or JSON with --json)."""
    result = build_estimate(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_table(result)
    return 0
