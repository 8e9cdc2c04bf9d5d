"""`zero-train config`: generate a DeepSpeed config from flags, or `zero-train config check FILE`.

    zero-train config --stage 3 --precision bf16 --offload-optimizer cpu \\
        --micro-batch-size 4 --grad-accum 2 --world-size 8           # JSON with train_batch_size 64
    zero-train config --stage 2 --model gpt2-small -o ds.json        # buckets from the model's hidden size
    zero-train config --stage 2 --hf-auto                            # "auto" where the HF Trainer fills values
    zero-train config check ds.json --world-size 8                   # validate any DeepSpeed JSON
    zero-train config --stage 3 --precision bf16 --world-size 2 --format accelerate -o accel.yaml
        # accel.yaml (DeepSpeed plugin) + accel.json; --engine fsdp2: the FSDP plugin (version 2)
    zero-train config check accel.json --accelerate accel.yaml       # YAML and JSON agree?
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from zero_train.cli.commands import COMMANDS
from zero_train.ds_config import config_text, load_config, write_config
from zero_train.ds_config.generate import ConfigRequest, generate_config
from zero_train.ds_config.keys import PRECISIONS
from zero_train.registry import DEEPSPEED, FAMILIES, FSDP2
from zero_train.runtime.errors import UsageError
from zero_train.runtime.outputs import check_output_file
from zero_train.runtime.parser import (
    OneLineParser,
    betas_pair,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    size_int,
)

NOT_FOR_CHECK = "does not apply to `config check` (only --world-size and --accelerate do)"


def config_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `config` (generate) and its `check` subcommand."""
    parser = subparsers.add_parser(
        "config",
        help=COMMANDS["config"],
        description="Generate the minimal DeepSpeed JSON for a ZeRO stage; `config check FILE` validates one.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    _add_generate_flags(parser)
    parser.set_defaults(func=config_command, uses_deepspeed=False)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=CheckParser)
    check = actions.add_parser(
        "check",
        help="validate a DeepSpeed JSON (every problem listed, exit 2; else a summary)",
        description="Validate FILE with DeepSpeed's own config classes plus the rules DeepSpeed does not enforce.",
    )
    check.add_argument("file", nargs="?", metavar="FILE", help="the DeepSpeed JSON")
    # SUPPRESS: a value given before `check` (`config --world-size 8 check f.json`) is not overwritten
    check.add_argument(
        "--world-size", type=positive_int, default=argparse.SUPPRESS, help="ranks to check for"
    )
    check.add_argument(
        "--accelerate", metavar="YAML", default=argparse.SUPPRESS, help="compare with this accelerate YAML"
    )
    check.set_defaults(
        func=config_check_command, generator_defaults=vars(parser.parse_args([])), uses_deepspeed=True
    )
    return parser


class CheckParser(OneLineParser):
    """The parser of `config check`: exactly one FILE, and no generator flag (it would be silently ignored)."""

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, then the two `config check` rules (UsageError: one line, exit 2)."""
        namespace, extras = super().parse_known_args(args, namespace)
        flags = [word.split("=")[0] for word in extras if word.startswith("-")]
        if flags:
            raise UsageError(f"{flags[0]} {NOT_FOR_CHECK}")
        if extras or getattr(namespace, "file", None) is None:
            raise UsageError(
                "`zero-train config check` takes exactly one FILE, e.g. zero-train config check ds.json"
            )
        return namespace, extras


def _add_generate_flags(parser: argparse.ArgumentParser) -> None:
    zero = parser.add_argument_group("ZeRO")
    zero.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=2, help="ZeRO stage (default 2)")
    zero.add_argument("--precision", choices=PRECISIONS, help="default fp32 (--hf-auto: auto)")
    zero.add_argument("--offload-optimizer", choices=("none", "cpu", "nvme"), default="none")
    zero.add_argument("--offload-param", choices=("none", "cpu", "nvme"), default="none", help="stage 3 only")
    zero.add_argument("--nvme-path", help="directory for nvme offload")
    batch = parser.add_argument_group("batch (train_batch_size = micro * accum * world size)")
    batch.add_argument("--micro-batch-size", type=positive_int, help="per rank per micro-step (default 1)")
    batch.add_argument("--grad-accum", type=positive_int, help="micro-steps per optimizer step (default 1)")
    batch.add_argument("--world-size", type=positive_int, help="ranks; writes train_batch_size")
    batch.add_argument(
        "--global-batch-size", type=positive_int, help="train_batch_size; derives the world size"
    )
    optim = parser.add_argument_group("optimizer and schedule")
    optim.add_argument("--optimizer", choices=("adamw", "adam", "sgd"), default="adamw")
    optim.add_argument("--lr", type=positive_float, help="peak learning rate (default 3e-4)")
    optim.add_argument("--weight-decay", type=non_negative_float)
    optim.add_argument("--betas", type=betas_pair, help="Adam betas, e.g. 0.9,0.95")
    optim.add_argument("--eps", type=positive_float, help="Adam epsilon (default 1e-8)")
    optim.add_argument("--momentum", type=non_negative_float, help="SGD momentum")
    optim.add_argument(
        "--fused-adam", action="store_true", help="DeepSpeed FusedAdam (GPU) instead of torch Adam"
    )
    optim.add_argument(
        "--scheduler", choices=("constant", "warmup_constant", "warmup_linear", "warmup_cosine")
    )
    optim.add_argument(
        "--warmup-steps", type=non_negative_int, help="0: none (DeepSpeed's warmup schedulers take >= 1)"
    )
    optim.add_argument("--warmup-type", choices=("linear", "log"), default="linear")
    optim.add_argument("--max-steps", type=positive_int, help="total optimizer steps (decay horizon)")
    optim.add_argument("--min-lr-ratio", type=non_negative_float, help="cosine floor as a fraction of lr")
    optim.add_argument(
        "--grad-clip", type=non_negative_float, help="max gradient norm, 0 = off (default 1.0)"
    )
    _add_comm_and_fp16_flags(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--model", help="a preset or an HF config folder: bucket sizes from its hidden size")
    out.add_argument(
        "--hf-auto",
        action="store_true",
        help='for the HF Trainer: "auto" where it fills values, its own lr scheduler (no scheduler '
        "block unless --scheduler/--warmup-steps/--max-steps), ZeRO-3 weights gathered on save",
    )
    out.add_argument("-o", "--output", help="write the JSON here (default stdout)")
    _add_accelerate_flags(parser)


def _add_accelerate_flags(parser: argparse.ArgumentParser) -> None:
    accel = parser.add_argument_group("accelerate (--format accelerate: -o YAML, the JSON beside it)")
    accel.add_argument("--format", choices=("deepspeed", "accelerate"), default="deepspeed")
    accel.add_argument("--engine", choices=FAMILIES, default=DEEPSPEED, help="plugin")
    accel.add_argument("--num-machines", type=positive_int, default=1, help="machines (default 1)")
    accel.add_argument("--machine-rank", type=non_negative_int, default=0)
    accel.add_argument("--main-process-ip", help="machine rank 0's address (several machines)")
    accel.add_argument("--main-process-port", type=positive_int, default=29500)
    accel.add_argument("--accelerate", metavar="YAML", help="config check: compare with this accelerate YAML")


def _add_comm_and_fp16_flags(parser: argparse.ArgumentParser) -> None:
    comm = parser.add_argument_group(
        "communication and ZeRO-3 knobs (defaults: DeepSpeed's, or from --model)"
    )
    comm.add_argument("--reduce-bucket-size", type=size_int)
    comm.add_argument("--allgather-bucket-size", type=size_int, help="stages 1-2")
    comm.add_argument("--overlap-comm", action=argparse.BooleanOptionalAction)
    comm.add_argument("--contiguous-gradients", action=argparse.BooleanOptionalAction)
    comm.add_argument("--prefetch-bucket-size", type=non_negative_int, help="stage 3")
    comm.add_argument("--param-persistence-threshold", type=non_negative_int, help="stage 3")
    comm.add_argument("--max-live-parameters", type=non_negative_int, help="stage 3")
    comm.add_argument(
        "--gather-16bit-weights-on-model-save", action=argparse.BooleanOptionalAction, help="stage 3"
    )
    fp16 = parser.add_argument_group("fp16 loss scaling")
    fp16.add_argument("--loss-scale", type=non_negative_float, help="static scale; 0 = dynamic (default)")
    fp16.add_argument("--initial-scale-power", type=non_negative_int, help="dynamic scale starts at 2**N")
    fp16.add_argument("--loss-scale-window", type=positive_int)
    fp16.add_argument("--hysteresis", type=positive_int)
    fp16.add_argument("--min-loss-scale", type=positive_float)


def request_from_args(args: argparse.Namespace):
    """The ConfigRequest the flags describe (the model's hidden size looked up for --model)."""
    # One keyword per flag: the shape of memory.model.peak's PeakModel.as_dict and timing.ranking.step_setup,
    # which copy other records.
    return ConfigRequest(
        stage=args.stage,
        precision=args.precision,
        offload_optimizer=args.offload_optimizer,
        offload_param=args.offload_param,
        nvme_path=args.nvme_path,
        micro_batch_size=args.micro_batch_size,
        grad_accum=args.grad_accum,
        world_size=args.world_size,
        global_batch_size=args.global_batch_size,
        optimizer=args.optimizer,
        lr=args.lr,
        weight_decay=args.weight_decay,
        betas=args.betas,
        eps=args.eps,
        momentum=args.momentum,
        torch_adam=not args.fused_adam,
        scheduler=args.scheduler,
        warmup_steps=args.warmup_steps,
        warmup_type=args.warmup_type,
        total_steps=args.max_steps,
        min_lr_ratio=args.min_lr_ratio,
        grad_clip=args.grad_clip,
        hidden_size=model_hidden_size(args.model) if args.model else None,
        reduce_bucket_size=args.reduce_bucket_size,
        allgather_bucket_size=args.allgather_bucket_size,
        overlap_comm=args.overlap_comm,
        contiguous_gradients=args.contiguous_gradients,
        prefetch_bucket_size=args.prefetch_bucket_size,
        param_persistence_threshold=args.param_persistence_threshold,
        max_live_parameters=args.max_live_parameters,
        gather_16bit_weights=args.gather_16bit_weights_on_model_save,
        loss_scale=args.loss_scale,
        initial_scale_power=args.initial_scale_power,
        loss_scale_window=args.loss_scale_window,
        hysteresis=args.hysteresis,
        min_loss_scale=args.min_loss_scale,
        hf_auto=args.hf_auto,
    )


def model_hidden_size(name_or_path: str) -> int:
    """The hidden size of a preset or HF config folder, found the way the HF DeepSpeed integration does."""
    from zero_train.hf.models import model_config

    config = model_config(name_or_path)
    for holder in (config, getattr(config, "text_config", None)):
        if holder is None:
            continue
        if getattr(holder, "hidden_size", None):
            return int(holder.hidden_size)
        if getattr(holder, "hidden_sizes", None):
            return int(max(holder.hidden_sizes))
    raise UsageError(f"model {name_or_path!r} has no hidden_size; give --reduce-bucket-size etc. by hand")


def config_command(args: argparse.Namespace) -> int:
    """Generate the config and print it (or write it to -o)."""
    if args.accelerate:
        raise UsageError("--accelerate YAML belongs to `zero-train config check FILE --accelerate YAML`")
    cfg = generate_config(request_from_args(args))
    if args.format == "accelerate":
        return write_accelerate(cfg, args)
    if args.output:
        write_config(cfg, args.output)
    else:
        sys.stdout.write(config_text(cfg))
    return 0


def write_accelerate(cfg: dict, args: argparse.Namespace) -> int:
    """-o accel.yaml: the accelerate YAML there and the DeepSpeed JSON beside it (accel.json)."""
    from zero_train.ds_config.accelerate import accelerate_config_text

    if not args.output or not args.output.endswith((".yaml", ".yml")):
        raise UsageError("--format accelerate needs -o FILE.yaml (the DeepSpeed JSON goes beside it)")
    check_output_file(args.output, flag="-o")
    json_path = str(pathlib.Path(args.output).with_suffix(".json"))
    text = accelerate_config_text(
        cfg,
        json_path=json_path,
        engine=args.engine,
        num_processes=args.world_size or 1,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        main_process_ip=args.main_process_ip,
        main_process_port=args.main_process_port,
        block_class=block_class(args.model) if args.model and args.engine == FSDP2 else None,
    )
    write_config(cfg, json_path)
    pathlib.Path(args.output).expanduser().write_text(text)
    print(f"wrote {args.output} and {json_path}")
    return 0


def block_class(model: str) -> str | None:
    """The transformer block class FSDP wraps (the first of HF's _no_split_modules), None if it names none."""
    from transformers import AutoModelForCausalLM

    from zero_train.hf.models import model_config

    config = model_config(model)
    names = getattr(AutoModelForCausalLM._model_mapping[type(config)], "_no_split_modules", None) or []
    return names[0] if names else None


def _refuse_generator_flags(args: argparse.Namespace) -> None:
    """A generator flag given before `check` (e.g. `config --stage 3 check f.json`) would be ignored: refuse it."""
    for name, default in args.generator_defaults.items():
        if (
            name not in ("world_size", "accelerate", "func", "action", "uses_deepspeed")
            and getattr(args, name) != default
        ):
            raise UsageError(f"--{name.replace('_', '-')} {NOT_FOR_CHECK}")


def config_check_command(args: argparse.Namespace) -> int:
    """Validate a config: a summary and exit 0, or every problem and exit 2."""
    _refuse_generator_flags(args)
    path = args.file
    cfg = load_config(path)
    from zero_train.ds_config.check import check_config

    report = check_config(cfg, world_size=args.world_size)
    if args.accelerate:
        from zero_train.ds_config.accelerate import agreement_problems, launch_fields, load_accelerate_config

        fields = launch_fields(load_accelerate_config(args.accelerate), from_env=False)
        report.problems += [f"{args.accelerate}: {problem}" for problem in agreement_problems(cfg, fields)]
        report.summary.append(f"accelerate: {args.accelerate} ({fields['distributed_type']}) agrees")
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    report.raise_if_invalid(path)
    print(f"{path}: valid DeepSpeed config")
    for line in report.summary:
        print(f"  {line}")
    return 0
