"""`zero-train train`: one training run in this process (under a launcher: `python -m zero_train.train`).

zero-train train --engine ddp --model tiny --max-steps 5
zero-train train --config run.toml --max-steps 50          # the file's settings, flags overriding them
torchrun --nproc_per_node 2 -m zero_train.train --engine zero2   # several ranks: the same flags

The flags are the run config's (zero_train.train.config), parsed by the same code as `python -m zero_train.train`.
"""

from __future__ import annotations

import argparse

from zero_train.cli.commands import COMMANDS
from zero_train.train.args import DESCRIPTION, add_run_flags, config_from_flags


def train_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `train` with the run config's flags."""
    parser = subparsers.add_parser(
        "train", help=COMMANDS["train"], description=DESCRIPTION, argument_default=argparse.SUPPRESS
    )
    add_run_flags(parser)
    parser.set_defaults(func=train_command)
    return parser


def train_command(args: argparse.Namespace) -> int:
    """Train as the flags (and --config file) say; returns 0."""
    from zero_train.train.main import train

    return train(config_from_flags(vars(args)))
