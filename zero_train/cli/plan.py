"""`zero-train plan`: the set-ups that fit a model, a cluster and a batch, ranked by predicted time, as a DeepSpeed JSON.

    zero-train plan --model llama-3-8b --nodes 2 --gpus-per-node 8 --gpu h100-sxm --tokens 1e9

    zero-train plan --model llama-3-8b --nodes 2 --gpus-per-node 8 --gpu-memory 80 --host-memory 1000 \\
        --global-batch-size 512 --block-size 4096 -o ds.json
    zero-train plan ... --format accelerate -o accel.yaml          # + accel.json beside it
    zero-train plan ... --format slurm -o train.sbatch             # + train.json beside it
    zero-train plan ... --hf-auto -o ds.json    # for TrainingArguments(deepspeed="ds.json", ...): DeepSpeed set-ups,
                                                # "auto" where the Trainer's arguments rule, its own lr scheduler

Prints the set-ups that fit, fastest first by predicted time to train --tokens (zero_train.timing: step time,
tokens/s, MFU, hours), each with its predicted peak per rank and host use, how much slower each runner-up is and
which term makes it so, and why the others do not fit; writes the first one (zero_train.memory.model.plan) and
prints the commands that train it, one per launcher (zero_train.cli.plan_run). A file -o would write that
exists is refused unless --force.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from zero_train.cli.commands import COMMANDS
from zero_train.cli.lora_flags import lora_spec
from zero_train.cli.machine_flags import machine_from_args
from zero_train.cli.plan_flags import DEFAULT_STEP_TOKENS, FORMAT_SUFFIXES, add_plan_flags
from zero_train.registry import DEEPSPEED, ENGINES
from zero_train.runtime.defaults import default_for
from zero_train.runtime.errors import UsageError

GB = 1e9
HF_TRAINER_ENGINES = tuple(spec.name for spec in ENGINES if spec.planned and spec.family == DEEPSPEED)
"""Set-ups a DeepSpeed JSON gives the HF Trainer (torch DDP and FSDP2 are its own options, not a JSON)."""


def plan_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `plan` with its flags."""
    parser = subparsers.add_parser(
        "plan",
        help=COMMANDS["plan"],
        description="Predict each set-up's peak per rank with the per-phase memory model, keep those whose peak "
        "stays within the GPU's memory minus the GPU margin (CUDA context, NCCL buffers, allocator slack: rules from "
        "published measurements, docs/gpu.md), rank them by predicted time to train --tokens (the step-time model: docs/steptime.md) "
        "and write the fastest.",
    )
    add_plan_flags(parser)
    parser.set_defaults(func=plan_command, startup=plan_imports)
    return parser


def plan_imports(args: argparse.Namespace) -> None:
    """Import what the plan will use (torch, transformers, the memory model), at once: the `zero-train` process
    does it with the garbage collector paused (zero_train.cli.main). Not the model's modeling module: only a
    shape or activations not yet stored need it (zero_train.memory.model.stored)."""
    from zero_train.hf import models  # noqa: F401  (imported for their cost)
    from zero_train.memory.model import activations, peak, plan  # noqa: F401
    from zero_train.timing import ranking, step  # noqa: F401


def _model(model: str, lora=None):
    """(config, shape) of --model (with LoRA's adapters: only they train)."""
    from zero_train.hf.models import model_config
    from zero_train.memory.model.theory import model_shape

    config = model_config(model)
    return config, model_shape(config, lora)


def fill_defaults(args: argparse.Namespace, config) -> None:
    """--gpu-memory from the --gpu preset, --block-size from the model, --global-batch-size from
    DEFAULT_STEP_TOKENS, --host-memory unchecked (the limit's largest)."""
    from zero_train.memory.model.estimate import default_block_size
    from zero_train.memory.model.limits import LIMITS
    from zero_train.timing.presets import GPUS

    if args.gpu_memory is None:
        if not args.gpu:
            raise UsageError("give --gpu-memory GB (or --gpu NAME, whose memory it takes)")
        args.gpu_memory = GPUS[args.gpu].memory_gb
    args.host_checked = args.host_memory is not None
    if args.host_memory is None:
        args.host_memory = float(LIMITS["host_memory_gb"].maximum)
    args.block_size = args.block_size or default_block_size(config)
    world = args.nodes * args.gpus_per_node
    if args.global_batch_size is None:
        args.global_batch_size = max(1, round(DEFAULT_STEP_TOKENS / args.block_size / world)) * world


def request_from_args(args: argparse.Namespace):
    """The PlanRequest (UsageError for an inconsistent batch, a bad headroom, an unknown model)."""
    from zero_train.hf.models import check_block_size
    from zero_train.memory.model.plan import PlanRequest

    if not 0 <= args.headroom < 1:
        raise UsageError(f"--headroom {args.headroom} must be a fraction in [0, 1), e.g. 0.1")
    lora = lora_spec(args)
    config, shape = _model(args.model, lora)
    fill_defaults(args, config)
    check_block_size(config, args.block_size)
    try:  # one keyword per flag, the shape of memory.probe's record dict: another record
        return PlanRequest(
            shape=shape,
            config=config,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            gpu_memory_gb=args.gpu_memory,
            host_memory_gb=args.host_memory,
            global_batch_size=args.global_batch_size,
            block_size=args.block_size,
            precision=args.precision,
            load_dtype=args.load_dtype,
            headroom=args.headroom,
            gpu_margin_gb=args.gpu_margin,
            backend="gloo" if args.device == "cpu" else "nccl",
            lora=lora,
        )
    except ValueError as err:
        raise UsageError(str(err)) from err


def chosen_config(plan, *, hf_auto: bool = False) -> dict:
    """The DeepSpeed JSON of the chosen set-up: the one its estimate read (hf_auto: with HF's "auto")."""
    from zero_train.memory.model.plan import setup_config

    chosen = plan.chosen
    return setup_config(
        plan.request, chosen.setup, chosen.micro_batch_size, chosen.grad_accum, hf_auto=hf_auto
    )


def trainer_arguments(plan, output: str | None) -> str:
    """The TrainingArguments that match the chosen set-up (the HF Trainer checks them against the JSON)."""
    chosen = plan.chosen
    arguments = [
        f'deepspeed="{output or "ds.json"}"',
        f"per_device_train_batch_size={chosen.micro_batch_size}",
        f"gradient_accumulation_steps={chosen.grad_accum}",
    ]
    if plan.request.precision in ("bf16", "fp16"):
        arguments.append(f"{plan.request.precision}=True")
    if chosen.setup.checkpointing:
        arguments.append("gradient_checkpointing=True")
    return f"TrainingArguments({', '.join(arguments)}, ...)"


def _count(num_params: int) -> str:
    return f"{num_params / 1e9:.2f}B" if num_params >= 1e9 else f"{num_params / 1e6:.1f}M"


def _lora_words(request) -> str:
    if request.lora is None:
        return ""
    return f" | LoRA r {request.lora.r}: {_count(request.shape.trainable_params)} adapter params train, base frozen"


def render(plan, ranked, args: argparse.Namespace, machine_note: str) -> str:
    """The table of fitting set-ups fastest first (time and memory side by side), the reasons the others do not
    fit, and the machine the times are for."""
    from zero_train.memory.model.gpu_terms import margin_line

    request = plan.request
    width = max(len(row.candidate.setup.name) for row in ranked) + 1
    host = f"host {args.host_memory:g} GB per machine" if args.host_checked else "host memory not checked"
    lines = [
        f"{args.model}: {_count(request.shape.num_params)} params | {args.nodes:,} x {args.gpus_per_node} "
        f"ranks of {args.gpu_memory:g} GB (usable {request.usable_bytes / GB:.1f}) | {host} | "
        f"{args.global_batch_size:,} x {args.block_size} tokens per step | {args.precision}"
        + _lora_words(request),
        f"time: {machine_note}; "
        + (
            f"ranked by hours to train {args.tokens:.3g} tokens (docs/steptime.md: the model's error against "
            "measured runs)"
            if ranked[0].step
            else "ranked cheapest (expected fastest) first"
        ),
    ]
    if request.margin:
        extra = f", minus --headroom {args.headroom:.0%}" if args.headroom else ""
        lines.append(margin_line(request.margin, args.gpu_memory * GB) + extra)
    lines.append(
        f"{'':2}{'set-up':<{width}} {'micro x accum':>13} {'step':>8} {'tokens/s':>10} {'MFU':>5} "
        f"{'hours':>8} {'peak/rank':>10} {'+slack':>8} {'host/machine':>12}  slower by (main term)"
    )
    for index, row in enumerate(ranked):
        candidate, step = row.candidate, row.step
        mark = "->" if index == 0 else "  "
        why = f"  +{row.slower_by:.1%} ({row.why})" if index and step else ""
        time = (
            f"{step.seconds:>7.2f}s {step.tokens_per_s:>10,.0f} {step.mfu:>5.0%} {row.hours:>8.2f}"
            if step
            else f"{'-':>8} {'-':>10} {'-':>5} {'-':>8}"
        )
        lines.append(
            f"{mark}{candidate.setup.name:<{width}} {candidate.micro_batch_size:>5} x {candidate.grad_accum:<5} "
            f"{time} {candidate.device_bytes / GB:>7.1f} GB {candidate.slack_bytes / GB:>5.1f} GB "
            f"{candidate.host_bytes / GB:>9.1f} GB{why}"
        )
    if any(row.candidate.host_bytes for row in ranked):
        lines.append(_host_legend(args))
    if plan.rejected:
        lines.append("set-ups that do not fit:")
        lines += [f"  {c.setup.name}: {c.reason}" for c in plan.rejected]
    return "\n".join(lines) + "\n"


def _host_legend(args: argparse.Namespace) -> str:
    """What host/machine counts: a load-time peak for most engines, which reads as a training cost otherwise."""
    check = (
        f"--host-memory {args.host_memory:g} checked it"
        if args.host_checked
        else "--host-memory GB checks it against your machines"
    )
    return (
        f"host/machine: one machine's host memory at its highest, its {args.gpus_per_node} ranks together: the "
        "larger of building the model (each rank holds the whole model in --load-dtype "
        f"{args.load_dtype} before it shards, all but DeepSpeed ZeRO-3's zero.Init) and training (offloaded "
        f"states); {check}"
    )


def output_paths(args: argparse.Namespace) -> list[pathlib.Path]:
    """The files -o writes (-o, and the JSON beside a YAML or a batch script), checked before any work: the
    suffix fits --format, the folder is writable, and an existing file is refused without --force."""
    from zero_train.runtime.outputs import check_output_file

    if not args.output:
        return []
    suffixes = FORMAT_SUFFIXES[args.format]
    if not args.output.endswith(suffixes):
        raise UsageError(f"--format {args.format} writes -o FILE{suffixes[0]}, not {args.output!r}")
    main = pathlib.Path(args.output).expanduser()
    paths = [main] if args.format == "deepspeed" else [main, main.with_suffix(".json")]
    for path in paths:
        check_output_file(path, flag="-o")
        if path.exists() and not args.force:
            raise UsageError(f"{str(path)!r} exists; pass --force to overwrite it (or another -o)")
    return paths


def plan_precision(device: str) -> str:
    """The default precision: bf16 (GPU runs), but fp32 for CPU ranks on a CPU that emulates bf16 (slower than
    fp32 there: docs/bench.md)."""
    from zero_train.bench.machine import bf16_emulated_on_cpu

    return "fp32" if device == "cpu" and bf16_emulated_on_cpu() else default_for("precision", "plan")


def plan_command(args: argparse.Namespace) -> int:
    """Print the plan; with -o write the chosen set-up and print the commands that train it."""
    from zero_train.memory.model.plan import make_plan
    from zero_train.timing.ranking import RankedSetup, rank_plan

    args.precision = args.precision or plan_precision(args.device)
    paths = output_paths(args)
    request = request_from_args(args)
    machine, note = machine_from_args(args, device=args.device)
    engines = HF_TRAINER_ENGINES if args.hf_auto else None
    try:
        if machine is None:  # no time to rank by: the memory plan's order, cheapest (expected fastest) first
            plan = make_plan(request, engines=engines)
            ranked = [RankedSetup(candidate=candidate) for candidate in plan.fitting]
        else:
            ranked, plan = rank_plan(request, machine, tokens=args.tokens, engines=engines)
    except ValueError as err:
        raise UsageError(str(err)) from err
    sys.stdout.write(render(plan, ranked, args, note))
    if args.hf_auto:
        print(f"HF Trainer: {trainer_arguments(plan, args.output)}")
    if not paths:
        print(
            "run: nothing written; -o plan.json (--format accelerate: -o plan.yaml, --format slurm: "
            "-o plan.sbatch) writes the config and prints the commands that train with it"
        )
        return 0
    write_plan(plan, args, paths)
    return 0


def write_plan(plan, args: argparse.Namespace, paths: list[pathlib.Path]) -> None:
    """Write the JSON (and the YAML or the batch script), then print the run block (not with --hf-auto: the
    HF Trainer's own script trains it)."""
    from zero_train.cli.plan_run import Cluster, run_lines, sbatch_script, train_config
    from zero_train.ds_config import write_config
    from zero_train.ds_config.accelerate import accelerate_config_text
    from zero_train.train.config import LoraConfig

    cfg, setup = chosen_config(plan, hf_auto=args.hf_auto), plan.chosen.setup
    json_path, main = str(paths[-1]), paths[0]
    write_config(cfg, json_path)
    cluster = Cluster(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        master_addr=args.master_addr,
        master_port=args.master_port,
    )
    config = train_config(
        plan.chosen,
        model=args.model,
        block_size=args.block_size,
        json_path=json_path,
        load_dtype=args.load_dtype,
        max_steps=args.max_steps,
        lora=LoraConfig(r=args.lora_r, target_modules=args.lora_target_modules),
    )
    if args.format == "accelerate":
        text = accelerate_config_text(
            cfg,
            json_path=json_path,
            engine=setup.family or setup.engine,
            num_processes=plan.request.world_size,
            num_machines=args.nodes,
            main_process_ip=args.master_addr,
            main_process_port=args.master_port,
        )
        main.write_text(text)
    if args.format == "slurm":
        main.write_text(sbatch_script(config, cluster, gpus=args.device == "cuda"))
    print(f"wrote {' and '.join(str(path) for path in paths)}")
    if args.hf_auto:  # the Trainer's script runs it, with the TrainingArguments printed above
        return
    yaml = str(main) if args.format == "accelerate" else None
    sbatch = str(main) if args.format == "slurm" else None
    print("\n".join(run_lines(config, cluster, accelerate_yaml=yaml, sbatch=sbatch)))
