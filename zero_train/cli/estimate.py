"""`zero-train estimate`: per-rank memory for ZeRO stages 0-3 before launching, device and host, and which fit.

"ours" is our PEAK model (zero_train.memory.model.estimate.estimate_setup): the most one rank holds in any phase
of a step, with activations counted on the real architecture (fake tensors), DeepSpeed's offload moved to the
host; on GPUs it is compared with the GPU's memory minus a named margin (assumed, not measured here;
--gpu-margin); the paper and DeepSpeed's estimators count model states only (DeepSpeed's with the set-up's
offload).

zero-train estimate --params 7.5e9 --world-size 64                 # the paper: 120 / 31.4 / 16.6 / 1.88 GB
zero-train estimate --model llama-3-8b --world-size 8 --gpu-memory 80 --block-size 8192 --gradient-checkpointing
zero-train estimate --model llama-3-8b --world-size 8 --gpu-memory 24 --config ds_configs/zero3_offload.json \
    --host-memory 512 --grad-accum 4
zero-train estimate --model path/to/config.json --world-size 2 --device cpu --json
"""

from __future__ import annotations

import argparse
import json
import math

from zero_train.cli.commands import COMMANDS
from zero_train.cli.estimate_time import add_step_times, add_time_flags, print_times
from zero_train.cli.lora_flags import add_lora_flags, lora_spec
from zero_train.cli.machine_flags import add_gpu_margin_flag
from zero_train.ds_config.keys import LOAD_DTYPES, PRECISIONS
from zero_train.memory.model.limits import flag_type
from zero_train.registry import ENGINES
from zero_train.runtime.defaults import default_for
from zero_train.runtime.errors import UsageError
from zero_train.runtime.parser import positive_float, positive_int, size_int

STAGE_NAMES = {0: "DDP (stage 0)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
MODELLED_ENGINES = tuple(spec.name for spec in ENGINES if spec.peak_model)
GB = 1e9


def _engine_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in MODELLED_ENGINES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{','.join(unknown) or text!r}: give engines of {','.join(MODELLED_ENGINES)}"
        )
    return names


def _row_name(row: dict) -> str:
    """The stage's name for the stage's default engine (DDP, DeepSpeed ZeRO-1/2/3), else the engine's."""
    from zero_train.memory.model.estimate import STAGE_ENGINES

    return STAGE_NAMES[row["stage"]] if STAGE_ENGINES[row["stage"]] == row["engine"] else row["engine"]


def estimate_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `estimate` with its flags."""
    parser = subparsers.add_parser(
        "estimate",
        help=COMMANDS["estimate"],
        description="Per-rank bytes for ZeRO stages 0-3 from (a) the ZeRO paper's formulas, (b) DeepSpeed's "
        "own estimators (model states only), (c) our model of the PEAK over a training step: model states as "
        "the engines hold them, communication buckets (from --config), activations counted on the model's real "
        "architecture (fake tensors: no memory), gradients before they are reduced, fp32 gradient copies, "
        "optimizer temporaries, DeepSpeed offload (host bytes per node); on GPUs it is compared with the GPU's "
        "memory minus a margin for the CUDA context, NCCL buffers and allocator slack (rules from published "
        "measurements, not measured here; --gpu-margin). GB = 1e9 bytes.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model",
        help="a preset (tiny, llama-3-8b, qwen2.5-7b, ...), a config.json, a local HF folder or a hub id",
    )
    source.add_argument(
        "--params", type=flag_type("params", positive_float), help="a raw parameter count instead, e.g. 7.5e9"
    )
    parser.add_argument(
        "--world-size", type=flag_type("world_size", size_int), required=True, help="data-parallel ranks"
    )
    parser.add_argument("--config", help="a DeepSpeed config (bucket sizes, precision, offload)")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=default_for("precision", "estimate"),
        help="default: the config's, else bf16",
    )
    # One declaration per flag (each its own bound, default and help: the same shape, not the same logic). plan's
    # --gpu-memory, --host-memory and --block-size (cli/plan_flags.py) differ in meaning: there a --gpu preset
    # supplies the memory and an absent --host-memory is not checked; here an absent one only says less.
    add = parser.add_argument
    add(
        "--gpu-memory",
        type=flag_type("gpu_memory_gb", positive_float),
        help="device memory per rank in GB: say which fit (after the GPU margin)",
    )
    add_gpu_margin_flag(parser)
    add(
        "--host-memory",
        type=flag_type("host_memory_gb", positive_float),
        help="host memory per node in GB (needed with offload)",
    )
    add(
        "--gpus-per-node",
        type=flag_type("gpus_per_node", positive_int),
        help="ranks per node (default: min(world size, 8))",
    )
    micro_batch_size = default_for("micro_batch_size", "estimate")
    add(
        "--micro-batch-size",
        type=flag_type("micro_batch_size", positive_int),
        default=micro_batch_size,
        help=f"for activations (default {micro_batch_size})",
    )
    add(
        "--block-size",
        type=flag_type("block_size", positive_int),
        help="tokens per sample (default: the model's context, at most 4096)",
    )
    grad_accum = default_for("grad_accum", "estimate")
    add(
        "--grad-accum",
        type=flag_type("grad_accum", positive_int),
        default=grad_accum,
        help=f"micro-batches per optimizer step (default {grad_accum})",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="activation checkpointing (scripts/train.py --gradient-checkpointing)",
    )
    load_dtype = default_for("load_dtype", "estimate")
    parser.add_argument(
        "--load-dtype",
        choices=tuple(LOAD_DTYPES),
        default=load_dtype,
        help=f"the dtype each rank builds the model in on the host (train.py --load-dtype; default {load_dtype}; "
        "ZeRO-3 builds under zero.Init on the GPU)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="where the ranks run (cpu: gloo collectives, no GPU margin); default cuda",
    )
    parser.add_argument(
        "--engines",
        type=_engine_list,
        help=f"rows: engines of {','.join(MODELLED_ENGINES)} (default: one per stage, DDP and DeepSpeed "
        "ZeRO-1/2/3), e.g. zero1,zero2 for our ZeRO-1/2",
    )
    add_lora_flags(parser)
    add_time_flags(parser)
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.set_defaults(func=estimate_command, startup=estimate_imports)
    return parser


def estimate_imports(args: argparse.Namespace) -> None:
    """Import what the estimate will use (the memory model, DeepSpeed's estimators; with --model torch and
    transformers), at once: the `zero-train` process does it with the garbage collector paused
    (zero_train.cli.main). Not the model's modeling module: only a shape or activations not yet stored need it
    (zero_train.memory.model.stored)."""
    from zero_train.memory.model import estimate, peak  # noqa: F401  (imported for their cost)
    from zero_train.memory.model.deepspeed_estimate import load_estimators
    from zero_train.timing import step  # noqa: F401

    if args.model:
        from zero_train.hf import models  # noqa: F401
        from zero_train.memory.model import activations  # noqa: F401
    load_estimators()


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


def _model(args: argparse.Namespace):
    """(the config or the parameter count, the block size)."""
    if args.params is not None:
        if args.block_size or args.gradient_checkpointing:
            raise UsageError(
                "--block-size and --gradient-checkpointing need --model (activations need its shape)"
            )
        return args.params, 0
    from zero_train.hf.models import max_context, model_config

    config = model_config(args.model)
    if args.block_size and args.block_size > max_context(config):
        raise UsageError(
            f"--block-size {args.block_size} exceeds {args.model}'s context ({max_context(config)})"
        )
    return config, args.block_size or 0


def build_estimate(args: argparse.Namespace) -> dict:
    """All numbers of the estimate, as the --json output (memory.model.estimate.SetupEstimate.as_dict, with
    each stage also under its earlier names: ours_bytes = device_peak_bytes, ours_peak_phase, ours_phases =
    device_phases, ours_categories = boundary)."""
    from zero_train.memory.model.estimate import estimate_setup
    from zero_train.memory.model.offload import OffloadSettings

    ds_config = None
    if args.config:
        from zero_train.ds_config import load_config

        ds_config = load_config(args.config)
    precision = _precision(args, ds_config)
    if OffloadSettings.from_config(ds_config).active and not args.host_memory:
        raise UsageError(
            f"{args.config} offloads to the host: give --host-memory GB (per node) to say if it fits"
        )
    model, block_size = _model(args)
    if args.gpu_margin is not None and not args.gpu_memory:
        raise UsageError("--gpu-margin is kept free of --gpu-memory: give --gpu-memory GB too")
    lora = lora_spec(args)
    if lora is not None and args.params is not None:
        raise UsageError("--lora-r needs --model (which modules get adapters), not --params")
    try:
        result = estimate_setup(
            model,
            world_size=args.world_size,
            precision=precision,
            micro_batch_size=args.micro_batch_size,
            block_size=block_size,
            grad_accum=args.grad_accum,
            gradient_checkpointing=args.gradient_checkpointing,
            ds_config=ds_config,
            load_dtype=args.load_dtype,
            device=args.device,
            gpus_per_node=args.gpus_per_node,
            gpu_memory_bytes=args.gpu_memory * GB if args.gpu_memory else None,
            gpu_margin_bytes=args.gpu_margin * GB if args.gpu_margin is not None else None,
            host_memory_bytes=args.host_memory * GB if args.host_memory else None,
            engines=args.engines,
            lora=lora,
        ).as_dict()
    except ValueError as err:
        raise UsageError(str(err)) from err
    for row in result["stages"]:
        row.update(
            ours_bytes=row["device_peak_bytes"],
            ours_peak_phase=row["device_peak_phase"],
            ours_phases=row["device_phases"],
            ours_categories=row["boundary"],
        )
    add_step_times(result, args, model, ds_config)
    return result


def _gb(value: float | None, unit: float = GB) -> str:
    """Three significant digits without exponents: 120, 31.4, 1.88, 1,010."""
    if value is None:
        return "-"
    scaled = value / unit
    decimals = max(0, 2 - math.floor(math.log10(scaled))) if scaled > 0 else 0
    return f"{scaled:,.{decimals}f}"


def _phase_line(row: dict, unit: float) -> str:
    """The terms of one stage's peak phase, largest first (the few that matter)."""
    terms = sorted(row["device_phases"][row["device_peak_phase"]].items(), key=lambda item: -item[1])
    words = ", ".join(f"{_words().get(name, name)} {_gb(value, unit)}" for name, value in terms[:5])
    more = f", + {len(terms) - 5} smaller" if len(terms) > 5 else ""
    phases = " | ".join(f"{name} {_gb(sum(t.values()), unit)}" for name, t in row["device_phases"].items())
    return f"  {_row_name(row)} ({phases}) peaks at {row['device_peak_phase']}: {words}{more}"


def _words() -> dict[str, str]:
    from zero_train.memory.model.offload import OFFLOAD_WORDS
    from zero_train.memory.model.peak import TERM_WORDS

    return {**TERM_WORDS, **OFFLOAD_WORDS}


def _header(result: dict, unit_name: str, exponent: int) -> str:
    block = ""
    if result["block_size"]:
        default = " (default: the context, at most 4,096)" if result["default_block_size"] else ""
        block = f", micro-batch {result['micro_batch_size']} x block {result['block_size']}{default}"
        block += f" x {result['grad_accum']} accumulated" if result["grad_accum"] > 1 else ""
        block += ", activation checkpointing" if result["gradient_checkpointing"] else ""
    offload = result["offload"]
    moved = [f"{what} -> {where}" for what, where in offload.items() if where != "none"]
    return (
        f"{result['num_params']:,} params, {result['world_size']:,} ranks ({result['gpus_per_node']} per node), "
        f"{result['precision']}{block}{'; offload ' + ', '.join(moved) if moved else ''}; "
        f"{unit_name} per rank (1 {unit_name} = 1e{exponent} bytes)"
    )


def _print_table(result: dict, *, explain: bool = False) -> None:
    unit, unit_name = (GB, "GB") if result["stages"][0]["paper_bytes"] >= GB else (1e6, "MB")
    print(_header(result, unit_name, 9 if unit_name == "GB" else 6))
    columns = f"{'stage':<14} {'paper':>8} {'DeepSpeed':>10} {'ours':>8} {'peak phase':<15} {'host/node':>9}"
    print(columns + f" {'DS host/node':>12}" + ("  fits" if result["gpu_memory_bytes"] else ""))
    for row in result["stages"]:
        line = (
            f"{_row_name(row):<14} {_gb(row['paper_bytes'], unit):>8} "
            f"{_gb(row['deepspeed_bytes'], unit):>10} {_gb(row['device_peak_bytes'], unit):>8} "
            f"{row['device_peak_phase']:<15} {_gb(row['host_per_node_bytes'], unit):>9} "
            f"{_gb(row['deepspeed_host_per_node_bytes'], unit):>12}"
        )
        print(line + ("" if row["fits"] is None else f"  {_fits_word(row)}"))
    print(
        "ours = predicted allocated peak on the device; DeepSpeed = its estimator per GPU (with the set-up's "
        "offload); host/node = host bytes of one node's ranks (ours, DeepSpeed's); each phase's total, and the "
        "peak phase's terms:"
    )
    for row in result["stages"]:
        print(_phase_line(row, unit))
    _print_host(result, unit)
    print_times(result, explain=explain, names=_row_name)
    for note in result["notes"]:
        print(f"note: {note}")
    _print_verdict(result)


def _fits_word(row: dict) -> str:
    if row["fits"]:
        return "yes"
    return "no (host)" if row["fits_device"] else "no"


def _print_host(result: dict, unit: float) -> None:
    for row in result["stages"]:
        if row["host_per_rank"]:
            terms = ", ".join(
                f"{_words().get(name, name)} {_gb(value, unit)}"
                for name, value in row["host_per_rank"].items()
            )
            nvme = f"; NVMe {_gb(row['nvme_per_rank_bytes'], unit)}" if row["nvme_per_rank_bytes"] else ""
            print(f"  {_row_name(row)} host per rank: {terms}{nvme}")


def _print_verdict(result: dict) -> None:
    from zero_train.memory.model.gpu_terms import margin_line

    capacity = result["gpu_memory_bytes"]
    if capacity is None:
        print(
            "give --gpu-memory GB to see which stages fit (after the GPU margin: CUDA context, NCCL buffers, "
            "allocator slack)"
        )
        return
    if result["gpu_margin"]:
        print(margin_line(result["gpu_margin"], capacity))
    usable = result["usable_gpu_bytes"]
    if result["recommended_stage"] is None:
        print(
            f"nothing fits in {_gb(usable)} GB usable of {_gb(capacity)} GB: add ranks, offload, "
            "checkpointing, or shrink the micro-batch"
        )
    else:
        row = next(row for row in result["stages"] if row["fits"])
        print(
            f"recommended: {_row_name(row)}, the lowest stage that fits (least communication and complexity)"
        )


def estimate_command(args: argparse.Namespace) -> int:
    """Print the estimate as a table (or JSON with --json)."""
    result = build_estimate(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_table(result, explain=args.explain)
    return 0
