"""`zero-train train`: one training run in this process, or its ranks started from here (--nproc-per-node).

zero-train train --engine ddp --model tiny --max-steps 5
zero-train train --config run.toml --max-steps 50          # the file's settings, flags overriding them
zero-train train --nproc-per-node 2 --engine zero2         # 2 ranks through torchrun, the run checked first
zero-train train --nproc-per-node 2 --launcher deepspeed --engine ds2
torchrun --nproc_per_node 2 -m zero_train.train --engine zero2   # the same ranks from torchrun itself

With --nproc-per-node the run is planned here, as each rank would plan it at that world size, before any rank
starts: a usage error is one line and exit 2 in the seconds of one plan, not after a launcher's start-up and
followed by its report of a failed rank. The flags are the run config's (zero_train.train.config), parsed by the
same code as `python -m zero_train.train`.
"""

from __future__ import annotations

import argparse

from zero_train.cli.commands import COMMANDS
from zero_train.runtime.parser import positive_int
from zero_train.train.args import DESCRIPTION, add_run_flags, config_from_flags

RANK_LAUNCHERS = ("torchrun", "deepspeed")
"""What --launcher starts the ranks with (zero_train.launch.ranks)."""


def train_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `train` with the run config's flags and the launch flags."""
    parser = subparsers.add_parser(
        "train", help=COMMANDS["train"], description=DESCRIPTION, argument_default=argparse.SUPPRESS
    )
    launch = parser.add_argument_group("launch", "start the run's ranks from here, the run checked first")
    launch.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        type=positive_int,
        metavar="N",
        help="start N ranks on this machine (CPU ranks with gloo, or one per GPU), after checking the run at "
        "world size N (default: train in this process)",
    )
    launch.add_argument(
        "--launcher",
        choices=RANK_LAUNCHERS,
        help="what starts the ranks with --nproc-per-node (default: torchrun, run inside this process)",
    )
    add_run_flags(parser)
    parser.set_defaults(func=train_command)
    return parser


def train_command(args: argparse.Namespace) -> int:
    """Train as the flags (and --config file) say, here or on --nproc-per-node ranks; returns the exit code."""
    from zero_train.runtime.errors import UsageError

    given = vars(args)
    nproc, launcher = given.get("nproc_per_node"), given.get("launcher")
    config = config_from_flags(given)
    if nproc is None:
        if launcher is not None:
            raise UsageError(f"--launcher {launcher} starts ranks: give --nproc-per-node N too")
        from zero_train.train.main import train

        return train(config)
    from zero_train.launch.command import Launch
    from zero_train.launch.ranks import launch_ranks
    from zero_train.train.args import run_argv
    from zero_train.train.main import check_run

    check_run(config, world_size=nproc)  # every usage error here, once, before a rank starts
    return launch_ranks(Launch(launcher=launcher or "torchrun", nproc_per_node=nproc), run_argv(config))
