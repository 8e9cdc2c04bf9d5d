"""Everything a run needs before its first step, checked before any collective that could hang.

Order matters: the flags, the output paths, the checkpoint to resume (its manifest), the DeepSpeed config,
the tokenizer, the model config, the block size and the batch algebra are checked on every rank from local
information only (each rank prints the same one line and exits 2); only then is torch.distributed
initialised and the dataset prepared (rank 0 builds it and sends its error, if any, to every rank:
zero_train.hf.data.prepare_datasets).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
from dataclasses import dataclass
from typing import Any

from zero_train.ds_config import load_config, resolve_auto, train_settings
from zero_train.ds_config.accelerate import agreement_problems, launch_fields
from zero_train.ds_config.auto import get_key
from zero_train.ds_config.generate import ConfigRequest, generate_config
from zero_train.ds_config.keys import AUTO, KEYS, RUN_TOTAL, RUN_WARMUP, UNSET, ConfigKey
from zero_train.runtime.errors import UsageError
from zero_train.runtime.outputs import check_output_dir, check_output_file

DEFAULT_CONFIG_STAGE = {"deepspeed": 2, "zero1": 1, "zero2": 2, "torch-zero": 1, "ddp": 0, "fsdp2": 3}


@dataclass(kw_only=True, slots=True)
class RunPlan:
    """What the flags resolved to (before any process group exists)."""

    ds_config: dict
    """The DeepSpeed config with every "auto" filled (what deepspeed.initialize gets)."""
    settings: Any
    """zero_train.ds_config.TrainSettings every engine trains with."""
    tokenizer: Any
    """The transformers tokenizer."""
    model_config: Any
    """The transformers PretrainedConfig of --model."""
    config_source: str
    """The config file, or a description of the generated default."""
    resume_checkpoint: pathlib.Path | None = None
    """The checkpoint --resume names, verified against its manifest (None: a fresh start)."""


def check_flag_combinations(args: argparse.Namespace) -> None:
    """UsageError for flags that only make sense together, and for outputs that could not be written.

    Every output path is checked now (writable, or creatable), not when the run first writes to it: a bad
    --memory-report must not cost the whole training run.
    """
    if args.save_every and not args.save_dir:
        raise UsageError("--save-every needs --save-dir (where to write checkpoints)")
    for flag, given in (("--save-total-limit", args.save_total_limit), ("--async-save", args.async_save)):
        if given and not args.save_dir:
            raise UsageError(f"{flag} needs --save-dir (where to write checkpoints)")
    if args.resume == "auto" and not args.save_dir:
        raise UsageError("--resume auto needs --save-dir (where to look for the latest checkpoint)")
    if args.save_dir:
        check_output_dir(args.save_dir, flag="--save-dir")
    for flag, path in (("--metrics-file", args.metrics_file), ("--memory-report", args.memory_report)):
        if path:
            check_output_file(path, flag=flag)
    if args.export_hf:
        # here, not at the top: plan_run's one-line errors (exit 2) come before transformers loads
        from zero_train.checkpoint.export import check_export_dir

        check_export_dir(args.export_hf)
    if args.local_rank is not None and "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = str(args.local_rank)


def plan_run(args: argparse.Namespace, *, world_size: int) -> RunPlan:
    """Resolve config, settings, tokenizer and model config from the flags (no collectives).

    Args:
        args: parsed scripts/train.py flags.
        world_size: from the launcher's environment (zero_train.runtime.dist.read_env).

    Returns:
        The RunPlan; UsageError on anything the user can fix.
    """
    # here, not at the top: plan_run's one-line errors (exit 2) come before transformers and torch load
    from zero_train.checkpoint.resume import resume_path
    from zero_train.hf.models import check_block_size, load_tokenizer, model_config

    check_flag_combinations(args)
    resume_checkpoint = resume_path(args.resume, args.save_dir)  # a damaged checkpoint fails here, early
    accelerate = launch_fields(os.environ, from_env=True)  # None unless started by `accelerate launch`
    config_file = args.deepspeed_config or (accelerate or {}).get("deepspeed_config_file")
    if config_file:
        cfg, source = load_config(config_file), config_file
    else:
        cfg, source = (
            default_config(args.engine),
            f"generated default (ZeRO stage {DEFAULT_CONFIG_STAGE[args.engine]})",
        )
    if accelerate is not None:
        problems = agreement_problems(cfg, accelerate, engine=args.engine)
        if problems:  # the YAML and the JSON describe one run: never train with a silent disagreement
            raise UsageError(f"accelerate config vs {source}: {problems[0]}")
    tokenizer = load_tokenizer(args.tokenizer)
    config = model_config(args.model, vocab_size=len(tokenizer))
    check_block_size(config, args.block_size)
    settings = train_settings(
        cfg,
        world_size=world_size,
        hidden_size=getattr(config, "hidden_size", None),
        **given_values(args, cfg),
    )
    return RunPlan(
        ds_config=resolve_auto(cfg, settings),
        settings=settings,
        tokenizer=tokenizer,
        model_config=config,
        config_source=source,
        resume_checkpoint=resume_checkpoint,
    )


def default_config(engine: str) -> dict:
    """The config of a run without --deepspeed_config: AdamW, warmup + cosine, every value "auto"."""
    request = ConfigRequest(stage=DEFAULT_CONFIG_STAGE[engine], hf_auto=True, scheduler="warmup_cosine")
    return generate_config(request)


def given_values(args: argparse.Namespace, cfg: dict) -> dict:
    """train_settings keyword arguments: the flags given, plus scripts/train.py's defaults (the `run` column of
    zero_train.ds_config.keys.KEYS) for "auto" values no flag fills; the rest fall to the HF Trainer's."""
    given = dict(
        micro_batch_size=args.micro_batch_size,
        grad_accum=args.grad_accum,
        lr=args.lr,
        weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps,
        grad_clip=args.grad_clip,
        precision=args.precision,
        total_steps=None,
    )
    for key in KEYS:
        if key.run is not UNSET and given.get(key.fills) is None and get_key(cfg, key.path) == AUTO:
            given[key.fills] = _run_default(key, args)
    return {name: value for name, value in given.items() if value is not None}


def _run_default(key: ConfigKey, args: argparse.Namespace) -> Any:
    if key.run == RUN_WARMUP:
        return max(1, args.max_steps // 10)
    if key.run == RUN_TOTAL:
        return args.max_steps
    return key.run


def model_builder(args: argparse.Namespace, plan: RunPlan, probe=None):
    """The model_fn engines call: seeded, so every rank (and every engine) starts from the same weights."""
    import torch  # here: planning a run (and its errors) must not wait for torch

    from zero_train.hf.models import PRESETS, build_model, enable_gradient_checkpointing, load_model

    def build():
        torch.manual_seed(args.seed)
        phase = probe.phase("model_built") if probe is not None else contextlib.nullcontext()
        with phase:
            if args.model in PRESETS:
                model = build_model(plan.model_config)
            else:
                model = load_model(args.model, vocab_size=len(plan.tokenizer))
        model.train()  # from_pretrained returns a model in eval mode: no dropout, no checkpointing
        if getattr(args, "gradient_checkpointing", False):
            enable_gradient_checkpointing(model)
        return model

    return build


def num_params(model) -> int:
    """Parameters of the full model (ZeRO-3 ranks hold partitions: DeepSpeed keeps the full size in ds_numel)."""
    seen: set[int] = set()
    total = 0
    for param in model.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            total += int(getattr(param, "ds_numel", param.numel()))
    return total


def import_run_modules(args: argparse.Namespace) -> None:
    """Import what the run will import (datasets, the model's transformers module, the engine's module and
    with it DeepSpeed), so that an entry point does it inside zero_train.runtime.startup.collector_paused."""
    import importlib

    import zero_train.hf.data  # noqa: F401  (datasets)
    from zero_train.engines.base import ENGINES
    from zero_train.hf.models import import_model_module

    import_model_module(args.model)
    if args.engine in ENGINES:
        importlib.import_module(ENGINES[args.engine][0])
