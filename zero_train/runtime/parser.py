"""An ArgumentParser whose errors are one line and exit code 2 (argparse prints usage + error), and flag types.

Shared by every entry point: the `zero-train` subcommands (zero_train.cli) and the scripts' own parsers
(scripts/train.py's flags in zero_train.train.args, scripts/bench.py).
"""

from __future__ import annotations

import argparse

from zero_train.runtime.errors import UsageError


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag raises UsageError, which entry points print as one line, exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0 (accepts 1e-4, 7.5e9)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text}")
    return value


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated integers >= 1, e.g. `1,2,4`."""
    return [positive_int(part.strip()) for part in text.split(",") if part.strip()]


def name_list(text: str) -> list[str]:
    """argparse type: comma-separated names, e.g. `ddp,zero1,ds3`."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list, got nothing")
    return names


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (0 switches a feature off, e.g. --grad-clip 0)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0 (accepts 1e5-style exponents that are whole)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if not (value >= 0 and value.is_integer()):
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text}")
    return int(value)


def size_int(text: str) -> int:
    """argparse type: a whole number >= 1, also written like 5e8."""
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text}")
    return value


def betas_pair(text: str) -> tuple[float, float]:
    """argparse type: two numbers in [0, 1), e.g. 0.9,0.95."""
    parts = [part.strip() for part in text.split(",")]
    try:
        pair = tuple(float(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers like 0.9,0.999, got {text!r}") from None
    if len(pair) != 2 or not all(0 <= beta < 1 for beta in pair):
        raise argparse.ArgumentTypeError(f"expected two numbers in [0, 1) like 0.9,0.999, got {text!r}")
    return pair
