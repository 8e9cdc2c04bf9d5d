"""`zero-train export CHECKPOINT OUT_DIR`: a training checkpoint -> a normal Hugging Face model folder.

zero-train export runs/tiny/ckpt out/tiny-hf             # follows the save dir's `latest`
zero-train export runs/tiny/ckpt/step-00000040 out/hf --dtype bf16 --force
zero-train export runs/lora/ckpt out/adapter              # a LoRA run: its PEFT adapter folder
zero-train export runs/lora/ckpt out/merged --merge       # a LoRA run: the base with the adapters merged
"""

from __future__ import annotations

import argparse

from zero_train.cli.commands import COMMANDS

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def export_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `export` with its flags."""
    parser = subparsers.add_parser(
        "export",
        help=COMMANDS["export"],
        description="Write config.json, model.safetensors and the tokenizer files to OUT_DIR, loadable with "
        "AutoModelForCausalLM.from_pretrained(OUT_DIR). DeepSpeed checkpoints give the fp32 master weights.",
    )
    parser.add_argument(
        "checkpoint", help="a checkpoint folder (step-XXXXXXXX) or a --save-dir (uses `latest`)"
    )
    parser.add_argument("out_dir", help="the folder to write (must be absent or empty unless --force)")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder or hub id (default: the one recorded in the checkpoint)",
    )
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default=None, help="cast the weights (default: as saved)"
    )
    parser.add_argument("--force", action="store_true", help="replace a non-empty OUT_DIR")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA run: write the base model with the adapters merged (a normal model folder) instead of "
        "the PEFT adapter folder",
    )
    parser.set_defaults(func=export_command)
    return parser


def export_command(args: argparse.Namespace) -> int:
    """Export, then print where the folder is and how to load it."""
    import torch

    from zero_train.checkpoint import atomic as checkpoint
    from zero_train.checkpoint.export import export_checkpoint
    from zero_train.checkpoint.export_lora import export_lora_checkpoint, is_lora_checkpoint
    from zero_train.runtime.errors import UsageError

    dtype = getattr(torch, DTYPES[args.dtype]) if args.dtype else None
    lora = is_lora_checkpoint(checkpoint.resolve(args.checkpoint))
    if args.merge and not lora:
        raise UsageError("--merge is for a LoRA run's checkpoint (--lora-r); this one trained every weight")
    if lora and not args.merge and dtype is not None:
        raise UsageError("--dtype casts a model's weights: pass --merge too (the adapter folder stays fp32)")
    options = dict(tokenizer=args.tokenizer, dtype=dtype, force=args.force)  # both exports take these
    if lora:
        out = export_lora_checkpoint(args.checkpoint, args.out_dir, merge=args.merge, **options)
    else:
        out = export_checkpoint(args.checkpoint, args.out_dir, **options)
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    print(f"exported {args.checkpoint} -> {out} ({files})")
    if lora and not args.merge:
        print(f"load with: PeftModel.from_pretrained(base_model, {str(out)!r}) (base: the run's --model)")
    else:
        print(f"load with: AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0
