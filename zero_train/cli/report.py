"""`zero-train report`: the run records of a profile directory -> report.md, PNG plots, summary.json, cells.json.

zero-train profile --model tiny --world-sizes 1,2 --out runs/profile
zero-train report runs/profile                          # -> runs/profile/report/
zero-train report runs/profile --out docs/report --no-plots
zero-train report runs/profile/report/summary.json --out docs/report --no-plots   # again, from the summary
"""

from __future__ import annotations

import argparse
import pathlib

from zero_train.cli.commands import COMMANDS


def report_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `report` with its flags."""
    parser = subparsers.add_parser(
        "report",
        help=COMMANDS["report"],
        description="Read the run records of `zero-train profile --out DIR` and write, into OUT, report.md "
        "(per-rank memory by category, model states vs the ZeRO paper, DeepSpeed's estimator and ours, peak "
        "vs our estimate, communication per step, every large gap explained), PNG plots, summary.json (every "
        "number) and cells.json (the numbers that matter per cell, a few KB each).",
    )
    parser.add_argument(
        "directory",
        metavar="DIR",
        help="a `zero-train profile --out` directory, or a report's summary.json (rendered again without the records)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="output directory (default: DIR/report; beside a summary.json given as DIR)",
    )
    parser.add_argument(
        "--no-plots", dest="plots", action="store_false", help="write no PNG plots; report.md then links none"
    )
    parser.set_defaults(func=report_command)
    return parser


def report_command(args: argparse.Namespace) -> int:
    """Write the report; print where each file went."""
    from zero_train.report.build import REPORT_NAME, write_report  # the memory model: torch, transformers

    source = pathlib.Path(args.directory)
    default_out = source.parent if source.is_file() else source / "report"
    out = pathlib.Path(args.out) if args.out else default_out
    paths = write_report(source, out, plots=args.plots)
    print(f"report: {paths[REPORT_NAME]} ({len(paths)} files in {out})")
    return 0
