"""The peer a user would otherwise pick: the Hugging Face Trainer with the same DeepSpeed config, model, data.

    deepspeed --num_gpus 2 --module zero_train.bench.peer_main --deepspeed_config cfg.json --engine ds1 \
        --model gpt2-25m --max-steps 8 --metrics-file hf.jsonl --memory-report hf.json

It takes train.py's flags and resolves them the same way (`zero_train.train.setup.plan_run`: the
DeepSpeed config with its "auto" values filled, the batch algebra, tokenizer and model config), then
maps the resolved settings onto `transformers.TrainingArguments`: a DeepSpeed engine (`--engine ds1`, ds2, ds3
or the alias deepspeed) hands the resolved config to the Trainer (`TrainingArguments(deepspeed=config)`),
`--engine ddp` trains with the Trainer's own DDP (no DeepSpeed). Same preset model from the same seed, same packed blocks, same micro-batch size and
accumulation; the Trainer's own sampler picks the order, and it applies weight decay to weight matrices
only (its default parameter groups), which changes the numbers, not the work. The run's HF schedule (linear by
default, its warmup) is the Trainer's own lr_scheduler_type and warmup_steps.

It writes what `zero-train bench` reads from scripts/train.py runs: the metrics JSONL (rank 0; one line per
optimizer step with step, loss, step_time_s = wall time between consecutive step ends, tokens_per_s) and,
with --memory-report, a JSON with every rank's peak allocator bytes and the communication payload of the
last step (CommLedger, counted from one step end to the next, as the train loop counts it).
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import time

import torch
import torch.distributed as dist
from accelerate.state import AcceleratorState, GradientState
from transformers import Trainer, TrainerCallback, TrainingArguments

from zero_train.bench.targets import PEER_PREFIX
from zero_train.comm.ledger import CommLedger
from zero_train.ds_config.keys import HF_SCHEDULERS
from zero_train.hf.prepare import prepare_text
from zero_train.memory import measure
from zero_train.registry import DEEPSPEED, ENGINES
from zero_train.runtime.device import read_env
from zero_train.runtime.dist import init_distributed, rank0_work_group
from zero_train.runtime.errors import UsageError
from zero_train.runtime.host_syncs import synchronize
from zero_train.train.config import RunConfig
from zero_train.train.setup import model_builder, plan_run
from zero_train.train.setup import num_params as count

PEER_SCHEMA = "zero_train.bench_peer/1"
UNSUPPORTED_FLAGS = ("save_dir", "resume", "export_hf", "eval_every")


def check_peer_config(config: RunConfig) -> None:
    """UsageError for train.py settings the peer does not implement (it only benchmarks: no checkpoints,
    no export, no evaluation, so --eval-batches has no effect either)."""
    parts = (config.checkpoint, config.evaluation)
    given = [
        f"--{name.replace('_', '-')}"
        for name in UNSUPPORTED_FLAGS
        for part in parts
        if getattr(part, name, None)
    ]
    if given:
        raise UsageError(f"the HF Trainer peer only benchmarks; drop {', '.join(given)}")


def training_arguments(config: RunConfig, plan, output_dir: str, device: torch.device):
    """TrainingArguments that match the resolved settings (the Trainer checks them against the config),
    on this rank's device (a CPU run on a GPU host stays on CPU)."""

    settings = plan.settings
    return TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=settings.micro_batch_size,
        gradient_accumulation_steps=settings.grad_accum,
        max_steps=config.training.max_steps,
        learning_rate=settings.lr,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.betas[0],
        adam_beta2=settings.betas[1],
        adam_epsilon=settings.eps,
        max_grad_norm=settings.grad_clip,
        # the run's HF schedule (train.schedule.run_schedule) as the Trainer builds it; a config's scheduler
        # block is DeepSpeed's to build, which wins over the Trainer's type
        lr_scheduler_type=settings.scheduler if settings.scheduler in HF_SCHEDULERS else "constant",
        warmup_steps=settings.warmup_steps if settings.scheduler in HF_SCHEDULERS else 0,
        bf16=settings.precision == "bf16",
        fp16=settings.precision == "fp16",
        deepspeed=plan.ds_config if plan.engine.family == DEEPSPEED else None,
        use_cpu=device.type == "cpu",
        logging_steps=1,  # a loss line per step, like scripts/train.py
        save_strategy="no",
        report_to=[],
        seed=config.training.seed,
        dataloader_num_workers=0,
        disable_tqdm=not config.output.progress,
    )


def collate_blocks(rows: list[dict]) -> dict[str, torch.Tensor]:
    """Packed blocks -> a batch whose labels are its inputs (the model shifts them), as in scripts/train.py."""
    input_ids = torch.tensor([row["input_ids"] for row in rows], dtype=torch.long)
    return {"input_ids": input_ids, "labels": input_ids}


class StepRecorder(TrainerCallback):
    """Wall time between step ends, the loss of each step, and the comm payload between step ends."""

    def __init__(self, ledger, tokens_per_step: int, device: torch.device | str = "cpu") -> None:
        self.ledger = ledger
        self.device = device  # CUDA: synchronised before each clock read (kernels run asynchronously)
        self.tokens_per_step = tokens_per_step
        self.step_times: list[float] = []
        self.losses: dict[int, float] = {}
        self.comm_bytes_per_step: dict | None = None
        self._last = time.perf_counter()

    def on_train_begin(self, training_args, state, control, **kwargs) -> None:
        synchronize(self.device)
        self._last = time.perf_counter()
        self.ledger.reset()

    def on_step_end(self, training_args, state, control, **kwargs) -> None:
        synchronize(self.device)
        now = time.perf_counter()
        self.step_times.append(now - self._last)
        self._last = now
        self.comm_bytes_per_step = self.ledger.totals()
        self.ledger.reset()

    def on_log(self, training_args, state, control, logs=None, **kwargs) -> None:
        if logs and "loss" in logs:
            self.losses[state.global_step] = float(logs["loss"])

    def metrics_lines(self) -> list[dict]:
        """One record per step, in scripts/train.py's metrics JSONL format (the fields the bench reads)."""
        return [
            dict(
                step=step,
                loss=self.losses.get(step),
                step_time_s=elapsed,
                tokens_per_s=self.tokens_per_step / elapsed,
            )
            for step, elapsed in enumerate(self.step_times, start=1)
        ]


def run_peer(config: RunConfig) -> None:
    """Train with transformers.Trainer as the run config says and write the metrics and memory/comm record."""

    check_peer_config(config)
    plan = plan_run(config, world_size=read_env()[1])  # every UsageError before any collective
    if not plan.engine.hf_peer:
        peers = " | ".join(spec.name for spec in ENGINES if spec.hf_peer)
        raise UsageError(f"the HF Trainer peer runs --engine {peers} (or deepspeed), not {plan.engine.name}")
    if plan.engine.family == DEEPSPEED:  # the Trainer's deepspeed.initialize, as our DeepSpeed engine does
        from zero_train.engines.deepspeed_engine import import_muon_uncompiled  # expensive: imports DeepSpeed

        import_muon_uncompiled(plan.ds_config)
    dist_info = init_distributed()  # gloo/nccl as in scripts/train.py; DeepSpeed and accelerate reuse it
    with rank0_work_group(dist_info.world_size) as waiting:  # rank 0 builds the dataset, the others wait long
        data = prepare_text(
            config.data.dataset,
            plan.tokenizer,
            block_size=config.data.block_size,
            seed=config.training.seed,
            process_group=waiting,
        )
    with CommLedger() as ledger, tempfile.TemporaryDirectory() as output_dir:
        # before the model: ZeRO-3 needs the Trainer's DeepSpeed config at zero.Init
        training_args = training_arguments(config, plan, output_dir, dist_info.device)
        measure.reset_peak(dist_info.device)
        model = model_builder(config.model, plan, seed=config.training.seed)()
        recorder = StepRecorder(
            ledger,
            tokens_per_step=plan.settings.train_batch_size * config.data.block_size,
            device=dist_info.device,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=data["train"],
            data_collator=collate_blocks,
            callbacks=[recorder],
        )
        trainer.train()
        rank_summary = dict(
            rank=dist_info.rank,
            peak_bytes=measure.peak_bytes(dist_info.device),
            comm_bytes_per_step=recorder.comm_bytes_per_step,
        )
        params = num_params(trainer.model)
        release_trainer(trainer)
    _write_outputs(config, plan, dist_info, recorder, rank_summary, params)


def release_trainer(trainer) -> None:
    """Free the Trainer's DeepSpeed engine (its `destroy()`), models, optimizers and accelerate's singletons.

    accelerate keeps its state in process-wide singletons and DeepSpeed's hooks keep the engine alive; a
    process that trains again (zero-train bench in one launch) must start from neither. The process group
    (accelerate's PartialState) stays: the next run reuses it.
    """
    engine = getattr(trainer, "model_wrapped", None)
    if hasattr(engine, "destroy"):
        engine.destroy()
    trainer.accelerator.free_memory()
    trainer.model = trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = None
    AcceleratorState._reset_state()
    GradientState._reset_state()


def num_params(model) -> int:
    """Parameters of the full model (the Trainer may hand back a DeepSpeed/DDP wrapper)."""

    return count(getattr(model, "module", model))


def _write_outputs(
    config: RunConfig, plan, dist_info, recorder: StepRecorder, rank_summary: dict, params: int
) -> None:
    """Rank 0: the metrics JSONL and the record with every rank's summary (gathered: collective)."""

    ranks = [rank_summary]
    if dist_info.world_size > 1:
        ranks = [None] * dist_info.world_size if dist_info.is_main else None
        dist.gather_object(rank_summary, ranks, dst=0)
    if not dist_info.is_main:
        return
    output = config.output
    if output.metrics_file:
        lines = [json.dumps(line) for line in recorder.metrics_lines()]
        _write_text(output.metrics_file, "\n".join(lines) + "\n")
    if output.memory_report:
        record = dict(
            schema=PEER_SCHEMA,
            engine=f"{PEER_PREFIX}{plan.engine.name}",
            framework="transformers.Trainer",
            model=config.model.model,
            num_params=params,
            precision=plan.settings.precision,
            world_size=dist_info.world_size,
            micro_batch_size=plan.settings.micro_batch_size,
            grad_accum=plan.settings.grad_accum,
            block_size=config.data.block_size,
            steps=len(recorder.step_times),
            ranks=ranks,
            error=None,
        )
        _write_text(output.memory_report, json.dumps(record, indent=2) + "\n")


def _write_text(path, text: str) -> None:
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
