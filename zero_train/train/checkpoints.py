"""A run's checkpoints: resume at the start, a save every --save-every steps and at the end.

    checkpoints = RunCheckpoints(config.checkpoint, plan, dist_info, max_steps=100, run_info={"model": "tiny"},
                                 data_position=data.position)
    step, micro_steps, position = checkpoints.resume(engine)   # (0, 0, None) for a fresh start
    checkpoints.save(engine, step)                    # every rank; at once, or in the background (--async-save)
    checkpoints.check_background(failed_anywhere)     # after each step's all-gather: a failed save stops all
    checkpoints.finish(engine, last_step)             # the last save, waited for

A checkpoint holds the engine's states (zero_train.checkpoint) plus what the loop needs to continue exactly:
the step, the micro-steps consumed (the data position of a packed dataset; a stream's is each rank's own read
position, zero_train.train.data), the global micro-batch and every rank's RNG state.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile

from zero_train.checkpoint.files import MODEL_DIR
from zero_train.checkpoint.resume import capture_rng, restore_rng
from zero_train.checkpoint.rotation import complete_checkpoints, reading
from zero_train.checkpoint.save import CheckpointSaver, SaveOptions, estimate_checkpoint_bytes
from zero_train.runtime import faults
from zero_train.runtime.dist import rank0_work_group
from zero_train.runtime.errors import UsageError
from zero_train.train.config import CheckpointConfig
from zero_train.train.log import get_logger
from zero_train.train.setup import RunPlan, absolute_if_local, num_params


class RunCheckpoints:
    """Saving and resuming for one run; without --save-dir, saving does nothing (resume still works).

    Args:
        config: the run config's checkpoint part.
        plan: the planned run (settings, engine, the checkpoint to resume, verified).
        dist_info: this process's DistInfo.
        max_steps: the run's last step (a checkpoint at or past it cannot be resumed).
        run_info: what run.json records of the run besides the engine and settings (model, data, seed).
        data_position: this rank's read position of a stream after the last batch (None for a packed dataset).
    """

    def __init__(
        self,
        config: CheckpointConfig,
        plan: RunPlan,
        dist_info,
        *,
        max_steps: int,
        run_info: dict,
        data_position=lambda: None,
    ) -> None:
        self.config, self.plan, self.dist_info, self.settings = config, plan, dist_info, plan.settings
        self.max_steps, self.data_position = max_steps, data_position
        # local paths absolute: export and resume work from any directory
        self.run_info = {
            key: absolute_if_local(value) if key in ("model", "tokenizer", "dataset") else value
            for key, value in run_info.items()
        }
        self.log = get_logger(dist_info.rank)
        self.latest = None  # the folder of this run's last complete checkpoint
        self.estimated_bytes: int | None = None
        self.side_folder: pathlib.Path | None = None  # rank 0's tokenizer and generation files (_side_files)
        self.saver = None
        if config.save_dir:
            options = SaveOptions(
                save_dir=config.save_dir, keep_last=config.save_total_limit, background=config.async_save
            )
            self.saver = CheckpointSaver(options, dist_info=dist_info)
        faults.note_checkpoints(config.save_dir, on_disk=self._on_disk)  # what a stopped rank's line names

    def due(self, step: int) -> bool:
        """Whether --save-every asks for a checkpoint after `step`."""
        return bool(self.config.save_every) and step % self.config.save_every == 0

    def failed_in_background(self) -> bool:
        """Whether this rank's background save failed (the step's all-gather tells every rank)."""
        return self.saver is not None and self.saver.failed_in_background()

    def finish(self, engine, step: int) -> None:
        """The last save; a background save completes before the run ends."""
        if self.saver is None:
            return
        self.save(engine, step)
        finished = self.saver.wait()
        if finished is not None:
            self._saved(finished)
        if self.side_folder is not None:
            shutil.rmtree(self.side_folder, ignore_errors=True)

    def save(self, engine, step: int) -> None:
        """Save after `step` (at once, or in the background with --async-save); every rank calls it."""
        client_state = dict(
            step=step,
            micro_steps=step * self.settings.grad_accum,
            global_micro_batch=self.settings.micro_batch_size * self.dist_info.world_size,
            rng=capture_rng(self.dist_info.device),
            data_position=self.data_position(),
        )
        run_info = dict(
            engine=self.plan.engine.name,
            **self.run_info,
            model_config=engine.model.config.to_dict(),
            world_size=self.dist_info.world_size,
            settings={name: getattr(self.settings, name) for name in self.settings.__slots__},
        )
        if self.estimated_bytes is None:
            self.estimated_bytes = estimate_checkpoint_bytes(
                engine, num_params=num_params(engine.model), dist_info=self.dist_info
            )
        faults.note_saving(step)
        with rank0_work_group(self.dist_info.world_size) as waiting:  # rank 0 hashes and publishes alone
            saved = self.saver.save(
                engine,
                step=step,
                client_state=client_state,
                run_info=run_info,
                estimated_bytes=self.estimated_bytes,
                process_group=waiting,
                extra_files=self._side_files(engine.model) if self.dist_info.is_main else None,
            )
        if saved is not None:
            self._saved(saved)
        else:
            self.log.info(f"checkpoint step {step}: writing in the background")

    def _side_files(self, model) -> dict[str, pathlib.Path]:
        """The tokenizer's files and the generation config, written once (rank 0) and copied into every
        checkpoint's model/ beside config.json, as the HF Trainer does: the checkpoint exports on its own,
        from any directory, moved or not."""
        if self.side_folder is None:
            self.side_folder = pathlib.Path(tempfile.mkdtemp(prefix="zt-side-files-"))
            self.plan.tokenizer.save_pretrained(str(self.side_folder))
            generation = getattr(model, "generation_config", None)
            if generation is not None:
                generation.save_pretrained(str(self.side_folder))
        return {
            f"{MODEL_DIR}/{path.name}": path for path in sorted(self.side_folder.iterdir()) if path.is_file()
        }

    def _on_disk(self) -> list[pathlib.Path]:
        """The complete checkpoints in --save-dir now (for a stopped rank's last line)."""
        return complete_checkpoints(self.config.save_dir) if self.config.save_dir else []

    def _saved(self, folder) -> None:
        self.latest = folder
        faults.note_saved(str(folder.resolve()))
        self.log.info(f"checkpoint {folder.name}: {folder}")

    def check_background(self, failed_anywhere: bool) -> None:
        """A background save that failed on any rank stops every rank here; a finished one is logged."""
        if self.saver is None:
            return
        if failed_anywhere:
            self.saver.wait()  # raises this rank's SaveFailed line (the ranks agreed in the thread)
            raise AssertionError("a rank flagged a failed background save, but this rank's succeeded")
        finished = self.saver.finished_in_background()
        if finished is not None:
            self._saved(finished)

    def resume(self, engine) -> tuple[int, int, dict | None]:
        """(steps done, micro-steps consumed, a stream's read position) from --resume, (0, 0, None) for a fresh
        start."""
        ckpt = self.plan.resume_checkpoint  # resolved and verified by plan_run, before any collective
        if ckpt is None:
            if self.config.resume == "auto":
                self.log.info(f"resume auto: no checkpoint in {self.config.save_dir} yet, starting fresh")
            return 0, 0, None
        with reading(ckpt):  # --save-total-limit never deletes a checkpoint while it is read
            client_state = engine.load_checkpoint(ckpt)
        restore_rng(client_state["rng"], self.dist_info.device)
        step, micro_steps = int(client_state["step"]), int(client_state["micro_steps"])
        global_batch = self.settings.micro_batch_size * self.dist_info.world_size
        if int(client_state["global_micro_batch"]) != global_batch:
            micro_steps = micro_steps * int(client_state["global_micro_batch"]) // global_batch
            self.log.warning(
                f"resume: the global micro-batch changed ({client_state['global_micro_batch']} -> "
                f"{global_batch} sequences); continuing at the nearest data position"
            )
        if step >= self.max_steps:
            raise UsageError(
                f"checkpoint {ckpt} is at step {step}, not before --max-steps "
                f"{self.max_steps}; raise --max-steps to train further"
            )
        faults.note_checkpoints(
            self.config.save_dir, last=str(pathlib.Path(ckpt).resolve()), on_disk=self._on_disk
        )
        self.log.info(f"resumed from {ckpt} at step {step}")
        return step, micro_steps, client_state.get("data_position")
