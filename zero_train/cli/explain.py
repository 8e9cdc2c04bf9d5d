"""`zero-train explain`: why a run's ranks ran out of memory, or how close a finished run came.

zero-train train --output-dir runs/a ...        # each rank keeps its record in runs/a/vitals/rank-N.json
zero-train explain runs/a                       # one line per rank

A rank that ran out of memory: the phase it was in, the largest term of our estimate against what it had, the
cheapest change that fits from `zero-train plan`'s search (zero_train.memory.oom, the line the rank printed); a
rank that was killed without a word (the kernel's out-of-memory killer): the same, from its last record; a rank
that finished: its highest use against what it had, and our estimate beside it.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from zero_train.cli.commands import COMMANDS
from zero_train.runtime.errors import UsageError


def explain_command_parser(subparsers) -> argparse.ArgumentParser:
    """Register `explain` with its flags."""
    parser = subparsers.add_parser(
        "explain",
        help=COMMANDS["explain"],
        description="Read the ranks' records of a run's --output-dir (DIR/vitals/rank-N.json) and say, per rank, "
        "why it ran out of memory and the cheapest change that fits, or how close it came.",
    )
    parser.add_argument("directory", metavar="RUN_DIR", help="a run's --output-dir (or its vitals/ folder)")
    parser.set_defaults(func=explain_command, uses_deepspeed=False)
    return parser


def kept_records(directory: pathlib.Path) -> list[dict]:
    """The ranks' kept records of a run directory, by rank; UsageError when there are none."""
    folder = directory / "vitals" if (directory / "vitals").is_dir() else directory
    paths = sorted(folder.glob("rank-*.json"), key=lambda path: int(path.stem.removeprefix("rank-")))
    if not paths:
        raise UsageError(
            f"{directory} holds no rank records (vitals/rank-N.json); give a run's --output-dir (train.py "
            "--output-dir DIR keeps them)"
        )
    return [json.loads(path.read_text()) for path in paths]


def explain_command(args: argparse.Namespace) -> int:
    """Print one line per rank."""
    records = kept_records(pathlib.Path(args.directory))
    from zero_train.memory.oom import kept_record_line

    for record in records:
        print(kept_record_line(record))
    return 0
