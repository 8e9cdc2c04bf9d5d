"""How a field of train.py's run config is a flag: its spellings, its parser and choices (checked the same way
from the command line, a TOML file or code), its default.

    r: int = flag(0, parse=non_negative_int, names=("--lora-r",), metavar="R")  # a field of a part (train.config)
    check_part(part)                                  # in its __post_init__: each field parsed as its flag would be
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, field, fields
from typing import Any

from zero_train.runtime.errors import UsageError


def flag(
    default: Any,
    *,
    parse=None,
    choices=None,
    names: tuple[str, ...] = (),
    metavar: str | None = None,
    negated: str | None = None,
    describe=None,
    switches: dict[str, Any] | None = None,
) -> Any:
    """A field that is a flag of train.py.

    Args:
        default: the field's default (the flag's when not given).
        parse: the argparse type (zero_train.runtime.parser): it also checks values from a file or code.
        choices: the values allowed.
        names: the flag's spellings, the first the one messages and run_argv use (default: `--field-name`);
            the HF Trainer's spelling is an alias where it means the same.
        metavar: as argparse's.
        negated: a bool field True by default, switched off by this flag (e.g. "--no-progress").
        describe: a function giving the choices in words (appended to the help; derived, never written here).
        switches: further spellings that each set one value, taking an optional true/false as the HF Trainer's
            bool arguments do (`--bf16` / `--bf16 true` is `--precision bf16`).
    """
    return field(
        default=default,
        metadata=dict(
            parse=parse,
            choices=choices,
            names=names,
            metavar=metavar,
            negated=negated,
            describe=describe,
            switches=switches or {},
        ),
    )


def check_part(part) -> None:
    """Check and normalise every field of a part as its flag's type would (UsageError: one line)."""
    for spec in fields(part):
        value, meta = getattr(part, spec.name), spec.metadata
        if value is None:
            continue
        where = f"{spec.name} ({flag_names(spec)[0]})"
        if isinstance(spec.default, bool) and not isinstance(value, bool):
            raise UsageError(f"{where}: expected true or false, got {value!r}")
        if meta.get("parse") is not None:
            try:
                value = meta["parse"](str(value))
            except argparse.ArgumentTypeError as err:
                raise UsageError(f"{where}: {err}") from None
            setattr(part, spec.name, value)
        elif spec.type in ("str | None", "str") and not isinstance(value, str):
            raise UsageError(f"{where}: expected a string, got {value!r}")
        if meta.get("choices") is not None and value not in meta["choices"]:
            raise UsageError(f"{where}: {value!r} is not one of {', '.join(meta['choices'])}")


def flag_names(spec) -> tuple[str, ...]:
    """The flag spellings of a field (its `negated` flag for a switched-off bool)."""
    meta = spec.metadata
    if meta.get("negated"):
        return (meta["negated"],)
    return meta.get("names") or ("--" + spec.name.replace("_", "-"),)


def field_default(spec) -> Any:
    """A field's default value (its factory's result for a factory field)."""
    return spec.default_factory() if spec.default is MISSING else spec.default
