"""What a training run says of itself: its first line, its configuration for the trackers, the run facts a
checkpoint keeps (run.json) and the LoRA facts of its run record (zero_train.train.loop writes them)."""

from __future__ import annotations

from dataclasses import asdict

from zero_train.train.config import RunConfig
from zero_train.train.setup import RunPlan


def start_line(config: RunConfig, plan: RunPlan, world_size: int) -> str:
    """The run's first line: engine, model and tokenizer, config, precision, batch, lr."""
    settings = plan.settings
    return (
        f"zero_train: engine {plan.engine.name} | model {config.model.model} | tokenizer {plan.tokenizer_source} | "
        f"world size {world_size} | config {plan.config_source} | stage {settings.zero_stage} | "
        f"{settings.precision} | micro batch {settings.micro_batch_size} x accum {settings.grad_accum} x world "
        f"{world_size} = {settings.train_batch_size} sequences of {config.data.block_size} | lr {settings.lr:g}"
        + (" | gradient checkpointing" if config.model.gradient_checkpointing else "")
        + (f" | LoRA r {config.lora.r}, alpha {config.lora.alpha:g} (base frozen)" if plan.lora else "")
    )


def hparams(config: RunConfig) -> dict:
    """The run config as flat `part.field` -> value, for the trackers' run configuration."""
    return {
        f"{part}.{name}": value for part, values in asdict(config).items() for name, value in values.items()
    }


def run_info(config: RunConfig, plan: RunPlan) -> dict:
    """What a checkpoint records of the run besides its engine's state (run.json)."""
    return dict(
        model=config.model.model,
        tokenizer=plan.tokenizer_source,
        dataset=config.data.dataset,
        block_size=config.data.block_size,
        seed=config.training.seed,
        lora=config.lora.recorded(),
    )


def lora_record(lora, model) -> dict | None:
    """The run record's LoRA facts: its settings and what trains (None without LoRA)."""
    if not lora.enabled:
        return None
    params = {id(p): p for p in model.parameters()}.values()
    trainable = [p for p in params if p.requires_grad]
    return dict(
        **lora.recorded(),
        adapter_params=sum(int(getattr(p, "ds_numel", p.numel())) for p in trainable),
        adapter_tensors=len(trainable),
    )
