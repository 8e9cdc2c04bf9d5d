"""`zero-train` entry point. Each subcommand lives in its own module, exposing
`<name>_command_parser(subparsers)`; this file only registers them.

`zero-train --help` (or no or an unknown subcommand) needs only the names and one-line helps
(zero_train.cli.commands): then no subcommand module is imported and the answer comes in a few tens of ms.

A subcommand whose parser sets a `startup` default (estimate, plan: torch, transformers, the model's module,
DeepSpeed's estimators) has those imports made first with the cyclic garbage collector paused, when the command
owns its process (`main()` without argv; zero_train.runtime.startup says why only then)."""

from __future__ import annotations

import importlib
import sys

from zero_train import __version__
from zero_train.cli.commands import COMMANDS
from zero_train.runtime.device import pin_deepspeed_accelerator
from zero_train.runtime.errors import run_cli
from zero_train.runtime.parser import OneLineParser
from zero_train.runtime.startup import collector_paused


def build_parser(argv: list[str] | None = None) -> OneLineParser:
    """The top-level parser with every subcommand registered.

    Args:
        argv: the arguments it will parse. Given, and naming no subcommand (`--help`, nothing, a typo), the
            subcommands are registered by name and help only (no module imported); None: all in full.
    """
    parser = OneLineParser(prog="zero-train", description="ZeRO configs, training, memory reports.")
    parser.add_argument("--version", action="version", version=f"zero-train {__version__}")
    parser.set_defaults(
        uses_deepspeed=True, startup=None
    )  # a subcommand that never imports DeepSpeed sets False
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    subparsers.required = True
    names_only = argv is not None and not set(argv) & set(COMMANDS)
    for name in COMMANDS:
        if names_only:
            subparsers.add_parser(name, help=COMMANDS[name])
            continue
        module_name = name.replace("-", "_")  # gpu-check: zero_train.cli.gpu_check
        module = importlib.import_module(f"zero_train.cli.{module_name}")
        getattr(module, f"{module_name}_command_parser")(subparsers)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Parse `argv` and run the chosen subcommand (its parser sets `args.func`)."""

    def entry() -> int | None:
        arguments = sys.argv[1:] if argv is None else argv
        args = build_parser(arguments).parse_args(arguments)
        if args.uses_deepspeed:
            pin_deepspeed_accelerator()  # before DeepSpeed's import: else it guesses, and warns on CPU
        if argv is None and args.startup is not None:
            with collector_paused():  # the process is ours: faster imports (zero_train.runtime.startup)
                args.startup(args)
        return args.func(args)

    run_cli(entry)


if __name__ == "__main__":
    main()
