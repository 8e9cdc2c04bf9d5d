"""`zero-train` entry point. Each subcommand lives in its own module, exposing
`<name>_command_parser(subparsers)`; this file only registers them."""

from __future__ import annotations

import importlib
import sys

from zero_train.runtime.errors import run_cli
from zero_train.runtime.parser import OneLineParser

# Module names under zero_train.cli; each defines `<module>_command_parser(subparsers)`.
COMMANDS = ["config", "export", "estimate", "plan", "profile", "report", "bench"]


def build_parser() -> OneLineParser:
    """The top-level parser with every subcommand registered."""
    parser = OneLineParser(prog="zero-train", description="ZeRO configs, training, memory reports.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    subparsers.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"zero_train.cli.{name}")
        getattr(module, f"{name}_command_parser")(subparsers)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Parse `argv` and run the chosen subcommand (its parser sets `args.func`)."""

    def entry() -> int | None:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        return args.func(args)

    run_cli(entry)


if __name__ == "__main__":
    main()
