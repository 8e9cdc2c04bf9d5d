"""Everything a run needs before its first step, checked before any collective that could hang.

Order matters: the run config (checked as it was built), the output paths, the checkpoint to resume (its manifest), the DeepSpeed config,
the tokenizer, the model config, the block size and the batch algebra are checked on every rank from local
information only (each rank prints the same one line and exits 2); only then is torch.distributed
initialised and the dataset prepared (rank 0 builds it and sends its error, if any, to every rank:
zero_train.hf.data.prepare_datasets).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
from dataclasses import dataclass, replace
from typing import Any

from zero_train.checkpoint.export import check_export_dir
from zero_train.checkpoint.resume import read_run_info, resume_path
from zero_train.ds_config import load_config, resolve_auto, train_settings
from zero_train.ds_config.accelerate import agreement_problems, launch_fields
from zero_train.ds_config.auto import get_key
from zero_train.ds_config.generate import ConfigRequest, generate_config
from zero_train.ds_config.keys import (
    AUTO,
    KEYS,
    RUN_LR,
    RUN_LR_FINE_TUNING,
    RUN_LR_FROM_SCRATCH,
    RUN_TOTAL,
    RUN_WARMUP,
    UNSET,
    ConfigKey,
)
from zero_train.ds_config.rules import check_rules
from zero_train.engines.build import engine_class
from zero_train.engines.precision import PRECISION_DTYPES
from zero_train.hf.lora import apply_lora, lora_shapes
from zero_train.hf.models import (
    PRESETS,
    check_block_size,
    enable_gradient_checkpointing,
    import_model_module,
    is_pretrained,
    model_config,
    seeded_model,
)
from zero_train.hf.prepare import is_offline_default
from zero_train.hf.shapes import SHAPE_PRESETS, check_buildable
from zero_train.hf.tokenizer import check_vocabulary, run_tokenizer, tokenizer_source
from zero_train.registry import DEEPSPEED, EngineSpec, resolve_engine
from zero_train.runtime.errors import UsageError
from zero_train.runtime.outputs import check_output_dir, check_output_file
from zero_train.train.config import DEFAULT_MAX_STEPS, ModelConfig, RunConfig, TrainingConfig
from zero_train.train.schedule import resumed_schedule, run_schedule, settings_line, warmup_steps
from zero_train.train.tracking import report_targets


@dataclass(kw_only=True, slots=True)
class RunPlan:
    """What the flags resolved to (before any process group exists)."""

    ds_config: dict
    """The DeepSpeed config with every "auto" filled (what deepspeed.initialize gets)."""
    settings: Any
    """zero_train.ds_config.TrainSettings every engine trains with."""
    tokenizer: Any
    """The transformers tokenizer."""
    tokenizer_source: str
    """Where it came from: --tokenizer, else the model's own (pretrained), else the offline stdlib-bpe."""
    model_config: Any
    """The transformers PretrainedConfig of --model."""
    config_source: str
    """The config file, or a description of the generated default."""
    engine: EngineSpec
    """The engine --engine resolved to on the config's ZeRO stage (an alias becomes the engine's own name)."""
    max_steps: int | None
    """The run's optimizer steps: --max-steps, else DEFAULT_MAX_STEPS, or None until the data gives
    --num-train-epochs' (settings then hold a provisional schedule: with_max_steps sets it)."""
    report_to: tuple[str, ...]
    """The trackers rank 0 opens (zero_train.train.tracking.report_targets: installed, "all" resolved)."""
    raw_config: dict
    """The DeepSpeed config as read or generated, "auto" values unfilled (with_max_steps fills them again)."""
    world_size: int
    """The launcher's world size."""
    pretrained: bool
    """--model is pretrained weights (a folder or hub id): fine-tuning defaults apply."""
    resume_checkpoint: pathlib.Path | None = None
    """The checkpoint --resume names, verified against its manifest (None: a fresh start)."""
    lora: Any = None
    """zero_train.hf.lora.LoraSpec of the adapters (None: every weight trains); its targets checked."""
    settings_line: str = ""
    """The run's optimizer settings and schedule, each with where it came from (zero_train.train.schedule)."""


def check_outputs(config: RunConfig) -> None:
    """UsageError for an output that could not be written, checked now (writable, or creatable) rather than when
    the run first writes to it: a bad --memory-report must not cost the whole training run."""
    if config.output.output_dir:
        check_earlier_run(config)
        check_output_dir(config.output.output_dir, flag="--output-dir")
    if config.checkpoint.save_dir:
        check_output_dir(config.checkpoint.save_dir, flag="--save-dir")
    for flag, path in (
        ("--metrics-file", config.output.metrics_file),
        ("--memory-report", config.output.memory_report),
        ("--output-dir", log_file(config.output)),
    ):
        if path:
            check_output_file(path, flag=flag)
    if config.checkpoint.export_hf:
        check_export_dir(config.checkpoint.export_hf)


def check_earlier_run(config: RunConfig) -> None:
    """The HF Trainer's rule: an --output-dir holding files is refused unless --resume continues the run there
    or --overwrite-output-dir starts over (its old checkpoints deleted here, so `latest` never sits beside a
    finished run's later steps). Hidden names (the write probes of other ranks) do not count."""
    folder = pathlib.Path(config.output.output_dir).expanduser()
    held = sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []
    if not held or config.checkpoint.resume:
        return
    if not config.output.overwrite_output_dir:
        raise UsageError(
            f"--output-dir {str(folder)!r} already holds a run ({', '.join(held[:3])}); give --resume auto to "
            "continue it, --overwrite-output-dir to start over in it, or another --output-dir"
        )
    save_dir = pathlib.Path(config.checkpoint.save_dir or folder / "checkpoints").expanduser()
    if os.environ.get("LOCAL_RANK", "0") == "0" and save_dir.is_dir():  # one rank per host deletes
        for old in save_dir.iterdir():
            if old.name == "latest" or old.name.startswith("step-"):
                shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)


def check_user_config(cfg: dict, source: str, *, engine: EngineSpec, world_size: int) -> None:
    """`zero-train config check`'s checks, on every engine: a typo'd key is one line naming the nearest known
    key, not a DeepSpeed traceback (ds*) or a setting silently ignored (ours). DeepSpeed's own classes check the
    values too where the engine imports DeepSpeed anyway."""
    check_rules(cfg, world_size=world_size).raise_if_invalid(source)
    if engine.family == DEEPSPEED:  # the engine imports DeepSpeed anyway
        # expensive: DeepSpeed (seconds), only for a DeepSpeed engine
        from zero_train.ds_config.check import check_config

        check_config(cfg, world_size=world_size).raise_if_invalid(source)


def absolute_if_local(spec: str | None) -> str | None:
    """A path that exists here, made absolute (what a checkpoint records); a hub id or preset unchanged."""
    if spec is None or not pathlib.Path(spec).expanduser().exists():
        return spec
    return str(pathlib.Path(spec).expanduser().resolve())


def log_file(output) -> str | None:
    """Where rank 0's lines are written besides stdout: --output-dir's train.log (None without one)."""
    return os.path.join(output.output_dir, "train.log") if output.output_dir else None


def plan_run(config: RunConfig, *, world_size: int) -> RunPlan:
    """Resolve the DeepSpeed config, settings, engine, tokenizer and model config (no collectives).

    Args:
        config: the run config (zero_train.train.args.parse_args).
        world_size: from the launcher's environment (zero_train.runtime.device.read_env).

    Returns:
        The RunPlan; UsageError on anything the user can fix.
    """
    check_outputs(config)
    checkpoint = config.checkpoint
    resume_checkpoint = resume_path(checkpoint.resume, checkpoint.save_dir)  # a damaged checkpoint fails here
    if resume_checkpoint is not None:
        check_resume_lora(resume_checkpoint, config.lora.recorded())
    accelerate = launch_fields(os.environ, from_env=True)  # None unless started by `accelerate launch`
    engine_name = config.engine.engine
    config_file = config.engine.deepspeed_config or (accelerate or {}).get("deepspeed_config_file")
    if config_file:
        cfg, source = load_config(config_file), config_file
        check_user_config(cfg, source, engine=resolve_engine(engine_name), world_size=world_size)
    else:
        stage = resolve_engine(engine_name).stage
        hf_schedule = is_pretrained(config.model.model) or config.optimizer.lr_scheduler_type is not None
        cfg = default_config(stage, warmup_steps=config.optimizer.warmup_steps, scheduler=not hf_schedule)
        source = f"generated default (ZeRO stage {stage})"
    if accelerate is not None:
        library = resolve_engine(engine_name).family or engine_name  # accelerate's plugin is the library's
        problems = agreement_problems(cfg, accelerate, engine=library)
        if problems:  # the YAML and the JSON describe one run: never train with a silent disagreement
            raise UsageError(f"accelerate config vs {source}: {problems[0]}")
    model, pretrained = config.model, is_pretrained(config.model.model)
    # a pretrained model first: a name that is neither cached nor a folder is a model's error, not its tokenizer's
    hf_config = model_config(model.model) if pretrained else None
    tokenizer = run_tokenizer(model.model, model.tokenizer)
    hf_config = hf_config or model_config(model.model, vocab_size=len(tokenizer))
    check_vocabulary(tokenizer, hf_config, model=model.model, tokenizer_given=model.tokenizer)
    check_block_size(hf_config, config.data.block_size)
    if (
        model.model not in PRESETS and model.model not in SHAPE_PRESETS
    ):  # a config.json, folder or hub id: transformers' own checks, as one line
        check_buildable(hf_config, model.model)
    lora = config.lora.spec()
    if lora is not None:
        lora_shapes(hf_config, lora)  # a target module that names nothing fails here, on the meta device
    max_steps = planned_steps(config.training)
    plan = RunPlan(
        engine=resolve_engine(engine_name),
        ds_config=cfg,
        settings=None,
        tokenizer=tokenizer,
        tokenizer_source=tokenizer_source(model.model, model.tokenizer),
        model_config=hf_config,
        config_source=source,
        max_steps=max_steps,
        report_to=report_targets(config.output),
        raw_config=cfg,
        world_size=world_size,
        pretrained=pretrained,
        resume_checkpoint=resume_checkpoint,
        lora=lora,
    )
    return with_max_steps(plan, config, max_steps)


def check_resume_lora(ckpt: pathlib.Path, asked: dict | None) -> None:
    """UsageError unless the checkpoint was saved with the LoRA settings this run asks for (both none too)."""
    saved = read_run_info(ckpt).get("lora")
    if saved == asked:
        return

    def words(settings: dict | None) -> str:
        if settings is None:
            return "every weight trained (no --lora-r)"
        return ", ".join(f"{name} {value}" for name, value in settings.items())

    raise UsageError(
        f"checkpoint {ckpt} was saved with {words(saved)}; this run asks for {words(asked)}: resume with the "
        "same [lora] settings (--lora-r, --lora-alpha, --lora-dropout, --lora-target-modules)"
    )


def planned_steps(training: TrainingConfig) -> int | None:
    """--max-steps (it wins, as in the HF Trainer), else DEFAULT_MAX_STEPS without --num-train-epochs, else
    None: the epochs' steps are known once the data is (RunData.steps_for_epochs)."""
    if training.max_steps is not None:
        return training.max_steps
    return DEFAULT_MAX_STEPS if training.num_train_epochs is None else None


def with_max_steps(plan: RunPlan, config: RunConfig, max_steps: int | None) -> RunPlan:
    """The plan of a run of `max_steps` (None: known once the data is, a provisional DEFAULT_MAX_STEPS horizon
    until then): the schedule's horizon and warmup default follow it, a resume re-plans it (or refuses)."""
    horizon = max_steps or DEFAULT_MAX_STEPS
    settings = _settings(
        config,
        plan.raw_config,
        world_size=plan.world_size,
        model_config=plan.model_config,
        pretrained=plan.pretrained,
        max_steps=horizon,
    )
    settings = run_schedule(
        settings, config=config, cfg=plan.raw_config, pretrained=plan.pretrained, max_steps=horizon
    )
    ckpt = plan.resume_checkpoint
    if ckpt is not None and max_steps is not None:
        info = read_run_info(ckpt)
        step = info.get("step", int(ckpt.name.split("-")[-1]) if ckpt.name.startswith("step-") else 0)
        settings = resumed_schedule(settings, saved=info.get("settings", {}), step=step, ckpt=ckpt)
    return replace(
        plan,
        engine=resolve_engine(
            config.engine.engine, settings.zero_stage
        ),  # the alias becomes the engine, once
        settings=settings,
        ds_config=resolve_auto(plan.raw_config, settings),
        max_steps=max_steps,
        settings_line=settings_line(
            config, plan.raw_config, settings, source=plan.config_source, pretrained=plan.pretrained
        ),
    )


def _settings(
    config: RunConfig, cfg: dict, *, world_size: int, model_config, pretrained: bool, max_steps: int
):
    given = given_values(config, cfg, pretrained=pretrained, max_steps=max_steps)
    hidden_size = getattr(model_config, "hidden_size", None)
    return train_settings(cfg, world_size=world_size, hidden_size=hidden_size, **given)


def default_config(stage: int, *, warmup_steps: int | None = None, scheduler: bool = True) -> dict:
    """The config of a run without --deepspeed_config (at its engine's stage), every value "auto": AdamW, and
    with `scheduler` DeepSpeed's warmup + cosine (warmup 0: written, since a cosine without warmup needs
    warmup_min_ratio 1.0); without, no scheduler block (the run's --lr-scheduler-type: train.schedule)."""
    if not scheduler:
        return generate_config(ConfigRequest(stage=stage, hf_auto=True))
    request = ConfigRequest(
        stage=stage, hf_auto=True, scheduler="warmup_cosine", warmup_steps=0 if warmup_steps == 0 else None
    )
    return generate_config(request)


def given_values(config: RunConfig, cfg: dict, *, pretrained: bool, max_steps: int) -> dict:
    """train_settings keyword arguments: the values given, plus train.py's defaults (the `run` column of
    zero_train.ds_config.keys.KEYS; a pretrained model's lr is a fine-tuning one) for "auto" values none fills;
    the rest fall to the HF Trainer's."""
    training, optimizer = config.training, config.optimizer
    given = dict(
        micro_batch_size=training.micro_batch_size,
        grad_accum=training.grad_accum,
        lr=optimizer.lr,
        weight_decay=optimizer.weight_decay,
        warmup_steps=warmup_steps(config, max_steps) if "scheduler" in cfg else None,  # else train.schedule's
        grad_clip=optimizer.grad_clip,
        precision=training.precision,
        total_steps=None,
    )
    for key in KEYS:
        if key.run is not UNSET and given.get(key.fills) is None and get_key(cfg, key.path) == AUTO:
            given[key.fills] = _run_default(key, max_steps, pretrained=pretrained)
    return {name: value for name, value in given.items() if value is not None}


def _run_default(key: ConfigKey, max_steps: int, *, pretrained: bool) -> Any:
    if key.run == RUN_LR:
        return RUN_LR_FINE_TUNING if pretrained else RUN_LR_FROM_SCRATCH
    if key.run == RUN_WARMUP:
        return max(1, max_steps // 10)
    if key.run == RUN_TOTAL:
        return max_steps
    return key.run


def model_builder(model: ModelConfig, plan: RunPlan, *, seed: int, probe=None):
    """The model_fn engines call: seeded, so every rank (and every engine) starts from the same weights, built in
    `model.load_dtype` (the engine casts it to the training precision).

    With LoRA (plan.lora) the model is peft's: the base frozen, the adapters initialised from the same seed
    right after the base (under ZeRO-3's zero.Init the base is built partitioned; DeepSpeed partitions the
    adapters when it wraps the model, as it does for the HF Trainer + peft).
    """
    dtype = PRECISION_DTYPES[model.load_dtype]

    def build():
        phase = probe.phase("model_built") if probe is not None else contextlib.nullcontext()
        with phase:
            built = seeded_model(
                model.model, seed=seed, vocab_size=len(plan.tokenizer), config=plan.model_config, dtype=dtype
            )
        built.train()  # from_pretrained returns a model in eval mode: no dropout, no checkpointing
        if model.gradient_checkpointing:
            enable_gradient_checkpointing(built)
        if plan.lora is not None:
            built = apply_lora(built, plan.lora, base_name=model.model)
        return built

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


def import_run_modules(config: RunConfig) -> None:
    """Import what the run will import (datasets, the model's transformers module, the engine's module and
    with it DeepSpeed), so that an entry point does it inside zero_train.runtime.startup.collector_paused."""
    data = config.data
    offline = is_offline_default(
        data.dataset, column=data.text_column, config_name=data.dataset_config, chat=data.sft
    )
    if data.streaming or not offline:
        import zero_train.hf.data  # noqa: F401  # expensive: datasets; the offline default trains without it

    import_model_module(config.model.model)
    engine_class(resolve_engine(config.engine.engine).name)
