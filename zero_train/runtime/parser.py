"""An ArgumentParser whose errors are one line and exit code 2 (argparse prints usage + error), and flag types.

Shared by every entry point: the `zero-train` subcommands (zero_train.cli) and the scripts' own parsers
(scripts/train.py's flags in zero_train.train.args, scripts/bench.py).
"""

from __future__ import annotations

import argparse
import sys

from zero_train.runtime.errors import UsageError


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag raises UsageError, which entry points print as one line, exit 2.

    A subcommand word argparse does not know (`zero-train config chek x.json`) is named as an unknown action; a
    stray word after an unknown flag (`config --stagee 3`) reports the flag, as argparse does without
    subcommands, not the word.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("exit_on_error", False)  # ArgumentErrors reach parse_known_args with their argument
        super().__init__(*args, **kwargs)
        self.subcommands: argparse.Action | None = None

    def add_subparsers(self, **kwargs):
        """argparse's, remembering the action (to word an unknown optional subcommand)."""
        self.subcommands = super().add_subparsers(**kwargs)
        return self.subcommands

    def parse_known_args(self, args=None, namespace=None):
        """argparse's; every error becomes one UsageError line."""
        try:
            return super().parse_known_args(args, namespace)
        except argparse.ArgumentError as err:
            optional = self.subcommands is not None and not self.subcommands.required
            if optional and err.argument_name == self.subcommands.metavar and "invalid choice" in err.message:
                self._unknown_subcommand(err, args, namespace)
            self.error(str(err))

    def _unknown_subcommand(self, err: argparse.ArgumentError, args, namespace) -> None:
        """An unknown word where an optional subcommand may stand: an unknown flag before it, else the word."""
        word = err.message.removeprefix("invalid choice: ").split(" (choose from")[0].strip("'\"")
        rest = list(sys.argv[1:] if args is None else args)
        if word in rest:
            rest.remove(word)
            try:
                _, extras = super().parse_known_args(rest, namespace)
            except (argparse.ArgumentError, UsageError):
                extras = []
            if any(extra.startswith("-") for extra in extras):
                self.error(f"unrecognized arguments: {' '.join(extras)}")
        choices = " | ".join(self.subcommands.choices)
        action = self.prog.split()[-1]
        self.error(f"unknown {action} action {word!r}; use `{self.prog} {choices} ...` or only flags")

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _number(text: str, convert, accept, *, expected: str, expected_value: str | None = None):
    """`convert(text)` if it is a number and `accept` takes it; else an ArgumentTypeError in one line
    "expected <expected>, got <text>" (`expected_value`, where given, names the accepted range more
    precisely than what was not a number at all)."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not accept(value):
        raise argparse.ArgumentTypeError(f"expected {expected_value or expected}, got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _number(text, int, lambda value: value >= 1, expected="a whole number >= 1")


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0 (accepts 1e-4, 7.5e9)."""
    return _number(
        text,
        float,
        lambda value: 0 < value < float("inf"),
        expected="a positive number",
        expected_value="a positive finite number",
    )


def at_most(parse, maximum: float, why: str):
    """argparse type: `parse`'s value, refused above `maximum` in one line that says why (the bound's reason)."""

    def bounded(text: str):
        value = parse(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(
                f"{value:,.6g} is beyond what is answered ({maximum:,.6g}: {why})"
            )
        return value

    bounded.__name__ = parse.__name__  # argparse names the type in its own messages
    return bounded


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
    return _number(
        text,
        float,
        lambda value: 0 <= value < float("inf"),
        expected="a number >= 0",
        expected_value="a finite number >= 0",
    )


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0 (accepts 1e5-style exponents that are whole)."""
    whole = _number(
        text, float, lambda value: value >= 0 and value.is_integer(), expected="a whole number >= 0"
    )
    return int(whole)


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
