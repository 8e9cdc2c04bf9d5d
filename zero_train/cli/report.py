"""`zero-train report`: the run records of a profile directory -> report.md, PNG plots, summary.json.

zero-train profile --model tiny --world-sizes 1,2 --out runs/profile
zero-train report runs/profile                          # -> runs/profile/report/
zero-train report runs/profile --out docs/report
"""

from __future__ import annotations

import argparse
import pathlib

from zero_train.cli.commands import COMMANDS
from zero_train.report.build import REPORT_NAME, write_report


def report_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `report` with its flags."""
    parser = subparsers.add_parser(
        "report",
        help=COMMANDS["report"],
        description="Read the run records of `zero-train profile --out DIR` and write, into OUT, report.md "
        "(per-rank memory by category, model states vs the ZeRO paper, DeepSpeed's estimator and ours, peak "
        "vs our estimate, communication per step, every large gap explained), PNG plots and summary.json.",
    )
    parser.add_argument("directory", metavar="DIR", help="a `zero-train profile --out` directory")
    parser.add_argument("--out", default=None, help="output directory (default: DIR/report)")
    parser.set_defaults(func=report_command)
    return parser


def report_command(args: argparse.Namespace) -> int:
    """Write the report; print where each file went."""
    out = pathlib.Path(args.out) if args.out else pathlib.Path(args.directory) / "report"
    paths = write_report(args.directory, out)
    print(f"report: {paths[REPORT_NAME]} ({len(paths)} files in {out})")
    return 0
