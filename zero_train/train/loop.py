"""The engine-agnostic training loop behind train.py (`python -m zero_train.train`).

    summary = run_training(parse_args(argv))    # {"final_loss", "steps", "tokens_per_s", ...}

The Trainer reads the run config's parts it owns (data, training, evaluation, output) and hands the others on:
the model's to the model builder, the checkpoint's to RunCheckpoints.

One optimizer step = settings.grad_accum micro-batches through engine.forward_backward, then engine.step().
Each rank reads its own rows of a seeded, per-epoch shuffle (zero_train.hf.batches.rank_batches), so the data
position is just the number of micro-steps consumed (a stream's is each rank's read position,
zero_train.train.data); a checkpoint stores it with every rank's RNG state, and a resumed fp32 run repeats the
uninterrupted run's losses exactly. Rank 0 reports each step to the trackers of --report-to
(zero_train.train.tracking) and, with --output-dir, copies its lines to DIR/train.log.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys

import torch.distributed as dist

from zero_train.checkpoint.atomic import on_rank0
from zero_train.checkpoint.export import export_model
from zero_train.checkpoint.export_lora import export_adapter
from zero_train.comm.step_counters import StepCounters
from zero_train.engines import build_engine
from zero_train.memory.probe import MemoryProbe
from zero_train.memory.record import write_record
from zero_train.runtime import vitals
from zero_train.runtime.device import read_env
from zero_train.runtime.dist import init_distributed, rank0_work_group
from zero_train.runtime.ports import free_port
from zero_train.runtime.vitals import note_estimate
from zero_train.train.checkpoints import RunCheckpoints
from zero_train.train.config import RunConfig
from zero_train.train.data import RunData
from zero_train.train.eval import evaluate
from zero_train.train.log import copied_to, get_logger
from zero_train.train.metrics import format_eval_line, format_step_line, perplexity, progress_bar
from zero_train.train.numerics import NonFiniteGuard
from zero_train.train.out_of_memory import note_run
from zero_train.train.run_info import hparams, lora_record, run_info, start_line
from zero_train.train.setup import RunPlan, log_file, model_builder, num_params, plan_run, with_max_steps
from zero_train.train.step_values import PendingSteps, StepClock
from zero_train.train.tracking import Trackers


def run_training(config: RunConfig, *, plan: RunPlan | None = None) -> dict:
    """Train as the run config says; returns a summary (on every rank).

    Args:
        config: from zero_train.train.args.parse_args (or built in code); plan: plan_run's, if already made.

    Returns:
        dict with final_loss, eval_loss, perplexity, steps, start_step, tokens_per_s, checkpoint, export.
        The default process group, if this call made it, is destroyed before it returns; one the caller made
        stays (the bench worker trains many runs in one).
    """
    _, world_size, _ = read_env()
    plan = plan or plan_run(config, world_size=world_size)  # every UsageError so far: before any collective
    if world_size == 1 and "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port())  # two single-process runs must not collide on 29500
    owns_group = (
        not dist.is_initialized()
    )  # a launched run makes the default group; the bench worker hands its own
    dist_info = init_distributed()
    note_estimate(
        model=config.model.model,
        world_size=dist_info.world_size,
        config=config.engine.deepspeed_config,
        precision=plan.settings.precision,
        micro_batch_size=plan.settings.micro_batch_size,
        grad_accum=plan.settings.grad_accum,
        block_size=config.data.block_size,
        gradient_checkpointing=config.model.gradient_checkpointing,
        device=dist_info.device.type,
    )
    note_run(config, plan, dist_info)
    log = get_logger(dist_info.rank)
    with copied_to(log, log_file(config.output) if dist_info.is_main else None):
        log.info(start_line(config, plan, dist_info.world_size))
        trainer = Trainer(config, plan, dist_info)
        try:
            summary = trainer.run()
        finally:
            trainer.close()
        vitals.note_outcome("finished")
    if (
        owns_group
    ):  # after a success only: a fault ends the process, and NCCL's destroy would wait on a dead peer
        dist.destroy_process_group()  # what PyTorch asks of a process before it exits (NCCL warns otherwise)
    return summary


class Trainer:
    """One run: data, engine, loop, evaluation, checkpoints, export and memory report."""

    def __init__(self, config: RunConfig, plan: RunPlan, dist_info) -> None:

        self.config, self.dist_info = config, dist_info
        self.training, self.output, self.evaluation = config.training, config.output, config.evaluation
        self.log = get_logger(dist_info.rank)
        micro = plan.settings.micro_batch_size
        vitals.note_phase("data")
        with rank0_work_group(dist_info.world_size) as waiting:  # rank 0 builds, the others wait long
            self.data = RunData.prepare(
                config.data,
                plan.tokenizer,
                seed=self.training.seed,
                dist_info=dist_info,
                micro_batch_size=micro,
                eval_blocks=config.evaluation.eval_batches * micro * dist_info.world_size,
                process_group=waiting,
            )
        if plan.max_steps is None:  # --num-train-epochs: its steps, now that the data's size is known
            steps = self.data.steps_for_epochs(
                self.training.num_train_epochs, grad_accum=plan.settings.grad_accum
            )
            plan = with_max_steps(plan, config, steps)
            self.log.info(f"{self.training.num_train_epochs:g} epochs = {steps} optimizer steps")
        self.log.info(plan.settings_line)  # the optimizer and schedule, and where each value came from
        self.plan, self.settings, self.max_steps = plan, plan.settings, plan.max_steps
        block_size = config.data.block_size
        self.probe = self._make_probe()
        self.engine = self._build_engine()
        self.guard = NonFiniteGuard(self.training.on_nonfinite, precision=self.settings.precision)
        self.tokens_per_step = (
            self.settings.micro_batch_size * self.settings.grad_accum * dist_info.world_size * block_size
        )
        self.step_times: list[float] = []
        self.clock, self.pending = StepClock(dist_info.device), PendingSteps(dist_info, self.tokens_per_step)
        self.counters = StepCounters(  # the run record's host syncs, collectives and overlap
            dist_info.device, steps=self.output.counted_steps if self.probe is not None else 0
        )
        self.last_loss = math.nan
        self.last_eval: dict | None = None
        self.checkpoints = RunCheckpoints(
            config.checkpoint,
            plan,
            dist_info,
            max_steps=self.max_steps,
            run_info=run_info(config, plan),
            data_position=self.data.position,
        )

    def close(self) -> None:
        """Release the engine (its `close()`, if it has one: DeepSpeed's engine and buffers), data and probe.

        After it the process holds what it held before the Trainer was built (zero-train bench runs many
        engines one after another in one launch and checks that, tests/bench/test_bench.py).
        """
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()
        if self.probe is not None:
            self.probe.close()
        self.engine = self.probe = self.data = None

    def _make_probe(self):
        if not self.output.memory_report:
            return None
        return MemoryProbe(self.dist_info)

    def _phase(self, name: str, **where):
        vitals.note_phase(name, **where)  # what this rank does, should it run out of memory
        return self.probe.phase(name) if self.probe is not None else contextlib.nullcontext()

    def _build_engine(self):

        with self._phase("engine_initialized"):
            engine = build_engine(
                self.plan.engine.name,
                model_fn=model_builder(
                    self.config.model, self.plan, seed=self.training.seed, probe=self.probe
                ),
                settings=self.settings,
                ds_config=self.plan.ds_config,
                dist_info=self.dist_info,
            )
        if self.probe is not None:
            self.probe.attach(engine)
        return engine

    def run(self) -> dict:
        """Resume if asked, train to the last step, evaluate, checkpoint, export; returns the summary."""
        start_step, micro_steps, position = self.checkpoints.resume(self.engine)
        batches = self.data.batches(micro_steps=micro_steps, position=position)
        trackers = Trackers.open(
            self.plan.report_to,
            output=self.output,
            hparams=hparams(self.config),
            start_step=start_step,
            enabled=self.dist_info.is_main,
        )
        bar = progress_bar(
            total=self.max_steps, initial=start_step, enabled=self.dist_info.is_main and self.output.progress
        )
        try:
            for step in range(start_step + 1, self.max_steps + 1):
                with self.counters.counting(step - start_step):
                    self._train_step(step, batches)
                    read = self._read_due(step)
                    if read:
                        self._read_and_report(trackers, bar)
                    self.counters.end_step(logged=read)
                if bar is not None:
                    bar.update(1)
                self._after_step(step, trackers)
            self._evaluate(self.max_steps, trackers)  # the final evaluation, reported too
        finally:
            trackers.close()
            if bar is not None:
                bar.close()
        return self._finish(start_step)

    def _train_step(self, step: int, batches) -> None:
        """One optimizer step; its values stay on the device (self.pending) until the loop reads them."""
        started = self.clock.start()
        losses = []
        for micro_batch in range(1, self.settings.grad_accum + 1):
            with self.counters.host_work():  # the data pipeline runs on the host
                batch = self._next_batch(batches)
            with self._phase("forward", step=step, micro_batch=micro_batch), self.counters.engine():
                losses.append(self.engine.forward_backward(batch["input_ids"], labels=batch.get("labels")))
        with self._phase("step", step=step), self.counters.engine():
            result = self.engine.step()
        if self.probe is not None:
            self.probe.on_step_end(self.engine, step)
        self.pending.add(step=step, losses=losses, result=result, timing=self.clock.stop(started))

    def _next_batch(self, batches) -> dict:
        """The next micro-batch, in pinned host memory on a CUDA run (the engine's copy then need not wait)."""
        batch = next(batches)
        if self.dist_info.device.type != "cuda":
            return batch
        return {name: tensor.pin_memory() for name, tensor in batch.items()}

    def _read_due(self, step: int) -> bool:
        """Whether the loop reads the pending values after `step`: a logged step, the last, or one before an
        evaluation or a checkpoint (which wait for the device anyway; a failed background save must stop every
        rank before the next save)."""
        evaluation = self.evaluation.eval_every and step % self.evaluation.eval_every == 0
        return (
            step % self.output.log_every == 0
            or step == self.max_steps
            or evaluation
            or self.checkpoints.due(step)
        )

    def _read_and_report(self, trackers: Trackers, bar) -> None:
        """Read every pending step (one host sync), check it, and report it: every step to JSONL, logged steps to
        the step line and the other trackers."""
        steps, save_failed = self.pending.read(save_failed=self.checkpoints.failed_in_background())
        self.checkpoints.check_background(save_failed)
        for record in steps:
            self.guard.check(
                step=record["step"],
                loss=record["loss"],
                grad_norm=record["grad_norm"],
                skipped=record["skipped"],
            )
            self.step_times.append(record["step_time_s"])
            self.last_loss = record["loss"]
            self._report(record, bar, trackers)

    def _report(self, record: dict, bar, trackers: Trackers) -> None:
        if not self.dist_info.is_main:
            return
        logged = record["step"] % self.output.log_every == 0 or record["step"] == self.max_steps
        trackers.log_step(record, logged=logged)
        if logged:
            line = format_step_line(record, self.max_steps)
            writing = (
                bar.external_write_mode(file=sys.stdout) if bar is not None else contextlib.nullcontext()
            )
            with writing:  # the bar (stderr) steps aside while the step line goes to stdout
                self.log.info(line)

    def _after_step(self, step: int, trackers: Trackers) -> None:
        last = step == self.max_steps
        if self.evaluation.eval_every and step % self.evaluation.eval_every == 0 and not last:
            self._evaluate(step, trackers)
        if self.checkpoints.due(step) and not last:
            vitals.note_phase("checkpoint", step=step)
            self.checkpoints.save(self.engine, step)

    def _evaluate(self, step: int, trackers: Trackers) -> None:
        vitals.note_phase("evaluation", step=step)
        eval_loss = evaluate(
            self.engine,
            self.data.validation,
            dist_info=self.dist_info,
            micro_batch_size=self.settings.micro_batch_size,
            max_batches=self.evaluation.eval_batches,
        )
        if eval_loss is None:
            return
        self.last_eval = dict(step=step, eval_loss=eval_loss, perplexity=perplexity(eval_loss))
        self.log.info(format_eval_line(self.last_eval))
        trackers.log_eval(self.last_eval)

    def _finish(self, start_step: int) -> dict:
        steps_done = self.max_steps
        vitals.note_phase("checkpoint", step=steps_done)
        self.checkpoints.finish(self.engine, steps_done)
        export = self._export()
        self._write_memory_report()
        median = statistics.median(self.step_times) if self.step_times else math.nan
        summary = dict(
            final_loss=self.last_loss,
            eval_loss=self.last_eval["eval_loss"] if self.last_eval else None,
            perplexity=self.last_eval["perplexity"] if self.last_eval else None,
            steps=steps_done,
            start_step=start_step,
            tokens_per_s=self.tokens_per_step / median if median > 0 else math.nan,
            checkpoint=str(self.checkpoints.latest) if self.checkpoints.latest else None,
            export=export,
        )
        self.log.info(
            f"done: {steps_done} steps | final loss {summary['final_loss']:.4f} | "
            f"tokens/s {summary['tokens_per_s']:.0f} (median step)"
        )
        return summary

    def _export(self) -> str | None:
        export_dir = self.config.checkpoint.export_hf
        if not export_dir:
            return None
        vitals.note_phase("export")

        state_dict = self.engine.full_state_dict()  # collective; the weights on rank 0, in CPU memory
        model, tokenizer = self.engine.model, self.plan.tokenizer
        if self.plan.lora is not None:  # the adapters alone: a PEFT adapter folder for the --model
            write = lambda: str(export_adapter(model, state_dict, tokenizer, export_dir))  # noqa: E731
        else:
            write = lambda: str(export_model(state_dict, model.config, tokenizer, export_dir))  # noqa: E731
        with rank0_work_group(self.dist_info.world_size) as waiting:  # rank 0 writes alone, maybe for minutes
            on_rank0(  # the others wait in the long-timeout group and raise rank 0's UsageError, if any
                write, dist_info=self.dist_info, process_group=waiting
            )
        what = "PEFT adapter folder" if self.plan.lora is not None else "Hugging Face model"
        self.log.info(f"exported {what} to {export_dir}")
        return export_dir

    def _write_memory_report(self) -> None:
        if self.probe is None:
            return
        meta = dict(
            engine=self.plan.engine.name,
            zero_stage=self.settings.zero_stage,
            model=self.config.model.model,
            num_params=num_params(self.engine.model),
            precision=self.settings.precision,
            world_size=self.dist_info.world_size,
            micro_batch_size=self.settings.micro_batch_size,
            grad_accum=self.settings.grad_accum,
            gradient_checkpointing=self.config.model.gradient_checkpointing,
            lora=lora_record(self.config.lora, self.engine.model),
            block_size=self.config.data.block_size,
            device=self.dist_info.device.type,
            ds_config=self.plan.ds_config,
        )
        record = self.probe.finish(
            self.engine,
            meta=meta,
            step_times_s=self.step_times,
            tokens_per_step=self.tokens_per_step,
            step_counters=self.counters.summary(),
        )
        if record is not None:
            write_record(record, self.output.memory_report)
            self.log.info(f"memory report: {self.output.memory_report}")
