"""train.py's command line, derived from the run config's fields (zero_train.train.config), and back to argv.

    config = parse_args(["--config", "run.toml", "--max-steps", "50"])   # flags override the file's values
    run_argv(config)                                                     # ["--max-steps", "50", ...]: the flags
                                                                         # that differ from the defaults

One table: each field of a part is one flag, its type, default and help (the docstring under the field). A
run.toml holds the same names by part:

    [model]
    model = "gpt2-25m"
    [training]
    max_steps = 50
    micro_batch_size = 4

Bad values give argparse's one-line errors (zero_train.runtime.parser types) from the command line, and the
same types' errors, naming the file and the field, from a file.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import pathlib
import sys
from dataclasses import fields
from typing import Any

from zero_train.runtime.errors import UsageError
from zero_train.runtime.parser import OneLineParser
from zero_train.train import config as run_config
from zero_train.train.config import PARTS, RunConfig
from zero_train.train.config_flags import field_default, flag_names

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, published as tomli before it joined the standard library (pyproject: python < 3.11)
    import tomli as tomllib

DESCRIPTION = (
    "Train a Hugging Face causal LM with DeepSpeed ZeRO 0-3, our ZeRO-1/2, torch's ZeroRedundancyOptimizer, "
    "FSDP2 or plain DDP, all configured by one DeepSpeed JSON."
)


def build_parser(prog: str = "train.py") -> OneLineParser:
    """train.py's parser (errors raise UsageError: one line, exit 2); absent flags are absent from its result."""
    parser = OneLineParser(prog=prog, description=DESCRIPTION, argument_default=argparse.SUPPRESS)
    add_run_flags(parser)
    return parser


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """Add every run-config field as a flag (dest "part.field"), --config, and the launchers' --local_rank.

    The parser must have argument_default=argparse.SUPPRESS: the file's values are overridden only by the
    flags actually given.
    """
    parser.add_argument(
        "--config",
        metavar="FILE.toml",
        help="the settings of these flags as a TOML file, by part ([model], [data], [training], ...); "
        "flags given here override it",
    )
    docs = field_docs()
    for part_name, part in PARTS.items():
        group = parser.add_argument_group(part_name, part.__doc__.split(": ", 1)[-1])
        for spec in fields(part):
            words = docs.get(f"{part.__name__}.{spec.name}", "")
            dest = f"{part_name}.{spec.name}"
            for name, value in spec.metadata["switches"].items():  # its own help names them
                group.add_argument(name, dest=dest, action=Switch, const=value, help=argparse.SUPPRESS)
            group.add_argument(*flag_names(spec), dest=dest, **_argument(spec, words))
    parser.add_argument(  # passed by the deepspeed launcher; LOCAL_RANK in the environment wins
        "--local_rank", "--local-rank", dest="local_rank", type=int, help=argparse.SUPPRESS
    )
    for name in HF_REFUSED:
        parser.add_argument(name, dest="hf_refused", action=Refused, nargs="?", help=argparse.SUPPRESS)


class Switch(argparse.Action):
    """A bool spelling as the HF Trainer parses it: `--bf16` or `--bf16 true` sets the value; `--bf16 false`
    leaves the flag as it was (a bool flag's `false` sets False)."""

    def __init__(self, option_strings, dest, const=None, **kwargs):
        super().__init__(option_strings, dest, nargs="?", const=const, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if values is self.const or parse_bool(values, option_string):  # no value given: argparse passes const
            setattr(namespace, self.dest, self.const)
        elif self.const is True:
            setattr(namespace, self.dest, False)


class Refused(argparse.Action):
    """An HF Trainer argument train.py has no meaning for: one line naming what to use instead."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError(
            f"{option_string} (an HF Trainer argument) is not supported here: {HF_REFUSED[option_string]}"
        )


def parse_bool(text: str, option: str) -> bool:
    """true/false as the HF Trainer's bool arguments take them (UsageError otherwise)."""
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise UsageError(f"{option} takes true or false, got {text!r}")


HF_REFUSED = {
    "--do_train": "training is what this command does; drop it",
    "--do_eval": "it evaluates at the end of every run; --eval-every K (--eval_steps) adds evaluations",
    "--eval_strategy": "use --eval-every K (--eval_steps K); it evaluates at the end too",
    "--evaluation_strategy": "use --eval-every K (--eval_steps K); it evaluates at the end too",
    "--save_strategy": "use --save-every K (--save_steps K); it saves at the end with --output-dir",
    "--logging_strategy": "use --log-every K (--logging_steps K)",
    "--logging_dir": "trackers write under --output-dir's runs/",
    "--per_device_eval_batch_size": "evaluation uses --micro-batch-size; --eval-batches sets how many",
    "--optim": "set the DeepSpeed config's optimizer.type (AdamW, Adam or SGD) with --deepspeed FILE",
    "--adam_beta1": "set optimizer.params.betas in the DeepSpeed config (--deepspeed FILE)",
    "--adam_beta2": "set optimizer.params.betas in the DeepSpeed config (--deepspeed FILE)",
    "--adam_epsilon": "set optimizer.params.eps in the DeepSpeed config (--deepspeed FILE)",
    "--lr_scheduler_kwargs": "use --lr-scheduler-type, --warmup-steps, or a scheduler block in the DeepSpeed config",
    "--max_steps_per_epoch": "use --max-steps",
    "--dataloader_num_workers": "the data is tokenized and packed before training; drop it",
    "--torch_compile": "not supported; drop it",
    "--push_to_hub": "export with --export-hf DIR (or zero-train export), then upload the folder",
    "--gradient_checkpointing_kwargs": "--gradient-checkpointing is always non-reentrant; drop the kwargs",
    "--tf32": "not supported; use --bf16 or --fp16",
    "--half_precision_backend": "--fp16 and --bf16 run in the engine's own mixed precision; drop it",
    "--ddp_backend": "the backend follows the device (gloo on CPU, nccl on CUDA); drop it",
    "--use_cpu": "ranks run on CPU where no GPU is visible; set CUDA_VISIBLE_DEVICES= to force it",
    "--no_cuda": "ranks run on CPU where no GPU is visible; set CUDA_VISIBLE_DEVICES= to force it",
    "--label_smoothing_factor": "not supported; drop it",
    "--load_best_model_at_end": "not supported: export the checkpoint you want with zero-train export",
    "--auto_find_batch_size": "zero-train plan finds the micro-batch that fits; pass its --micro-batch-size",
    "--validation_file": "the held-out split is taken from --dataset (--eval-batches sets its size)",
    "--max_train_samples": "use --max-steps",
    "--per_gpu_train_batch_size": "use --per_device_train_batch_size (--micro-batch-size)",
}
"""HF TrainingArguments (and run_clm) spellings train.py has no meaning for -> what to use instead."""


def _argument(spec, words: str) -> dict[str, Any]:
    """argparse keywords of one field: its type, choices, metavar and help (its docstring + default)."""
    meta, default = spec.metadata, field_default(spec)
    if meta.get("describe") is not None:
        words += f" ({meta['describe']()})"
    if meta["switches"]:  # the HF Trainer's spellings of one value each
        words += (
            " ("
            + ", ".join(f"{name}: {flag_names(spec)[0]} {value}" for name, value in meta["switches"].items())
            + ")"
        )
    if isinstance(default, bool) and meta.get("negated"):
        return dict(action="store_false", help=words)
    if isinstance(default, bool):  # `--flag` or, as the HF Trainer's bools, `--flag true|false`
        return dict(action=Switch, const=True, help=words)
    if default is not None:
        words += f" (default {default})"
    metavar = meta.get("metavar") or (None if meta.get("choices") else spec.name.upper())
    keywords = dict(help=words, type=meta.get("parse"), choices=meta.get("choices"), metavar=metavar)
    return {key: value for key, value in keywords.items() if value is not None}


@functools.cache
def field_docs() -> dict[str, str]:
    """Part.field -> the docstring under the field in zero_train.train.config (none without its source)."""
    try:
        tree = ast.parse(pathlib.Path(run_config.__file__).read_text())
    except OSError:  # installed without sources (.pyc only): the flags still work, without help
        return {}
    docs = {}
    for part in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        for statement, following in zip(part.body, part.body[1:], strict=False):
            if isinstance(statement, ast.AnnAssign) and isinstance(following, ast.Expr):
                text = following.value.value if isinstance(following.value, ast.Constant) else ""
                docs[f"{part.name}.{statement.target.id}"] = " ".join(str(text).split())
    return docs


def parse_args(argv: list[str] | None = None, *, prog: str = "train.py") -> RunConfig:
    """Parse train.py's command line (and its --config file) into the run config; UsageError on a bad value."""
    return config_from_flags(vars(build_parser(prog).parse_args(argv)))


def config_from_flags(given: dict[str, Any]) -> RunConfig:
    """The run config of parsed flags (dest "part.field" -> value; other keys ignored), over --config's file."""
    local_rank = given.get("local_rank")
    if local_rank is not None and "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = str(local_rank)
    values: dict[str, dict[str, Any]] = {}
    if given.get("config"):
        values = load_config_file(given["config"])
    for key, value in given.items():
        if "." in key:
            part, name = key.split(".", 1)
            values.setdefault(part, {})[name] = value
    return build_config(values)


def load_config_file(path: str) -> dict[str, dict[str, Any]]:
    """A run.toml's tables, checked (UsageError naming the file: missing, not TOML, an unknown or bad value)."""
    try:
        with open(os.path.expanduser(path), "rb") as file:
            values = tomllib.load(file)
    except OSError as err:
        raise UsageError(f"--config {path}: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"--config {path}: not TOML ({err})") from None
    try:
        build_config(values)
    except UsageError as err:
        raise UsageError(f"--config {path}: {err}") from None
    return values


def build_config(values: dict[str, Any]) -> RunConfig:
    """RunConfig from {part: {field: value}} (UsageError for an unknown part or field, or a bad value)."""
    unknown = [name for name in values if name not in PARTS]
    if unknown:
        raise UsageError(f"unknown table [{unknown[0]}]; the tables are {', '.join(f'[{p}]' for p in PARTS)}")
    parts = {}
    for name, part in PARTS.items():
        given = values.get(name, {})
        if not isinstance(given, dict):
            raise UsageError(f"{name} must be a table ([{name}]), got {given!r}")
        known = [spec.name for spec in fields(part)]
        strange = [key for key in given if key not in known]
        if strange:
            raise UsageError(f"[{name}] has no setting {strange[0]!r}; it has {', '.join(known)}")
        parts[name] = part(**given)
    return RunConfig(**parts)


def run_argv(config: RunConfig, *, explicit: tuple[str, ...] = ()) -> list[str]:
    """The flags that give `config` (those that differ from the defaults): parse_args(run_argv(c)) == c.

    `explicit`: fields (e.g. "model", "block_size") given even at their defaults, for a command printed to run
    later, whose meaning must not change with train.py's defaults (a bool at its default has no flag to give).
    """
    argv = []
    for part_name in PARTS:
        part = getattr(config, part_name)
        for spec in fields(part):
            value, default = getattr(part, spec.name), field_default(spec)
            if value == default and (spec.name not in explicit or value is None or isinstance(value, bool)):
                continue
            if isinstance(default, bool):
                argv.append(
                    flag_names(spec)[0]
                )  # the flag turns the default over (--async-save, --no-progress)
            else:
                argv += [flag_names(spec)[0], str(value)]
    return argv
