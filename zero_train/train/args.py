"""The flags of scripts/train.py (see docs/launch.md for what each one does and the launch commands).

Batch sizes, lr, warmup, clipping and precision flags default to None: with a `--deepspeed_config` they
only fill its "auto" values (a concrete config value that disagrees with a given flag is an error, as
in the Hugging Face Trainer); without a config, a default config is generated with every value "auto", and
what no flag fills takes scripts/train.py's default, else the HF Trainer's (zero_train.ds_config.keys: the
`run` and `hf` columns).
"""

from __future__ import annotations

import argparse

from zero_train.ds_config.keys import PRECISIONS
from zero_train.runtime.parser import (
    OneLineParser,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from zero_train.train.numerics import NONFINITE_POLICIES

ENGINE_CHOICES = ("deepspeed", "zero1", "zero2", "ddp", "torch-zero", "fsdp2")


def build_parser(prog: str = "train.py") -> OneLineParser:
    """The argument parser of scripts/train.py (errors raise UsageError: one line, exit 2)."""
    parser = OneLineParser(
        prog=prog,
        description="Train a Hugging Face causal LM with DeepSpeed ZeRO 1/2/3, our ZeRO-1, torch's "
        "ZeroRedundancyOptimizer or plain DDP, all configured by one DeepSpeed JSON.",
    )
    _add_setup_flags(parser)
    _add_optimization_flags(parser)
    _add_output_flags(parser)
    return parser


def _add_setup_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--deepspeed_config",
        "--deepspeed-config",
        dest="deepspeed_config",
        default=None,
        metavar="FILE",
        help="DeepSpeed JSON (batch sizes, precision, optimizer, schedule, clipping, ZeRO stage) read by "
        "every engine; 'auto' values are filled from the flags (default: a generated config)",
    )
    add(
        "--engine",
        choices=ENGINE_CHOICES,
        default="deepspeed",
        help="deepspeed: ZeRO at the config's stage; zero1: our ZeRO-1 sharder; zero2: our ZeRO-2 sharder; "
        "ddp: plain DDP; torch-zero: torch ZeroRedundancyOptimizer; fsdp2: torch fully_shard, stage 3 = "
        "reshard after forward, stage 2 = keep gathered (default: deepspeed)",
    )
    add(
        "--model",
        default="tiny",
        help="a preset (tiny, gpt2-25m, gpt2-small, llama-tiny, llama-60m), a "
        "save_pretrained folder, or a hub id (default: tiny)",
    )
    add(
        "--dataset",
        default=None,
        help="'stdlib' (offline default), a local file/folder "
        "(txt, json, jsonl, csv, parquet), or a hub id[:config]",
    )
    add("--tokenizer", default=None, help="a tokenizer folder or hub id (default: the offline stdlib-bpe)")
    add("--block-size", type=positive_int, default=64, help="tokens per training sequence (default 64)")
    add("--seed", type=non_negative_int, default=0, help="model init, data order (default 0)")
    add(
        "--local_rank", "--local-rank", dest="local_rank", type=int, default=None, help=argparse.SUPPRESS
    )  # passed by the deepspeed launcher; LOCAL_RANK in the environment wins


def _add_optimization_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--micro-batch-size", type=positive_int, default=None, help="sequences per rank per micro-step")
    add("--grad-accum", type=positive_int, default=None, help="micro-steps per optimizer step")
    add("--lr", type=positive_float, default=None, help="peak learning rate")
    add("--weight-decay", type=non_negative_float, default=None)
    add("--warmup-steps", type=positive_int, default=None, help="linear warmup steps of the schedule")
    add("--max-steps", type=positive_int, default=100, help="optimizer steps to train (default 100)")
    add("--grad-clip", type=non_negative_float, default=None, help="max global grad norm, 0 = off")
    add("--precision", choices=PRECISIONS, default=None, help="override the config's precision")
    add(
        "--gradient-checkpointing",
        action="store_true",
        help="activation checkpointing: keep each block's input only and recompute the block in backward "
        "(Hugging Face's, non-reentrant; less memory, ~1/3 more compute)",
    )
    add(
        "--on-nonfinite",
        choices=NONFINITE_POLICIES,
        default="stop",
        help="a NaN/inf loss or grad norm: stop the run (default) or skip the step",
    )


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--eval-every",
        type=non_negative_int,
        default=0,
        help="eval loss + perplexity on the held-out split every K steps and at the end (0 = end only)",
    )
    add("--eval-batches", type=positive_int, default=8, help="micro-batches per rank per evaluation")
    add("--log-every", type=positive_int, default=1, help="print the step line every K steps (default 1)")
    add("--metrics-file", default=None, metavar="FILE", help="JSONL: one object per step (rank 0 writes)")
    add("--memory-report", default=None, metavar="FILE", help="write the per-rank memory run record (JSON)")
    add("--save-dir", default=None, metavar="DIR", help="checkpoint directory")
    add(
        "--save-every",
        type=non_negative_int,
        default=0,
        help="checkpoint every K steps and at the end (needs --save-dir; 0 = only at the end)",
    )
    add(
        "--save-total-limit",
        type=positive_int,
        default=None,
        metavar="K",
        help="keep only the last K complete checkpoints (older ones are deleted once a new one is complete; "
        "never the one `latest` names, nor one being read)",
    )
    add(
        "--async-save",
        action="store_true",
        help="write checkpoints in a background thread (state copied to host memory first); training goes "
        "on meanwhile, `latest` moves when the write is complete",
    )
    add(
        "--resume",
        default=None,
        metavar="PATH|auto",
        help="a checkpoint dir, a save dir (follows its `latest`), or 'auto' (--save-dir's latest, if any)",
    )
    add(
        "--export-hf",
        default=None,
        metavar="DIR",
        help="at the end, write a Hugging Face folder (config, safetensors, tokenizer)",
    )
    add("--no-progress", action="store_true", help="no progress bar (the step lines stay)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse scripts/train.py's command line (UsageError on a bad flag)."""
    return build_parser().parse_args(argv)
