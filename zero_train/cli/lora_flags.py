"""--lora-r and --lora-target-modules for `zero-train estimate` and `plan`: train.py's [lora] flags, same names."""

from __future__ import annotations

import argparse

from zero_train.runtime.errors import UsageError
from zero_train.runtime.parser import non_negative_int


def add_lora_flags(parser: argparse.ArgumentParser) -> None:
    """Register --lora-r and --lora-target-modules (the memory needs no alpha or dropout)."""
    parser.add_argument(
        "--lora-r",
        type=non_negative_int,
        default=0,
        metavar="R",
        help="LoRA adapters of rank R on a frozen base, as train.py --lora-r (default 0: full fine-tuning)",
    )
    parser.add_argument(
        "--lora-target-modules",
        metavar="NAMES",
        help="comma-separated modules (or all-linear) that get adapters (default: peft's "
        "choice for the architecture)",
    )


def lora_spec(args: argparse.Namespace):
    """The zero_train.hf.lora.LoraSpec of the flags, None without --lora-r (UsageError as train.py gives)."""
    from zero_train.train.config import LoraConfig

    if args.lora_target_modules is not None and not args.lora_r:
        raise UsageError(
            "--lora-target-modules needs --lora-r R (the adapters' rank); add it or drop the flag"
        )
    return LoraConfig(r=args.lora_r, target_modules=args.lora_target_modules).spec()
