"""One checkpoint save as the train loop runs it: free space first, every rank writes, the ranks agree, commit.

    saver = CheckpointSaver(SaveOptions(save_dir=..., keep_last=3, background=True), dist_info=info)
    saver.save(engine, step=40, client_state=..., run_info=..., estimated_bytes=...)
    saver.raise_if_failed(flagged)   # each step: a background failure seen by any rank stops every rank
    saver.wait()                     # before the next save and at the end of training

1. Free space: every rank compares the free space of the save dir with the checkpoint's expected size (the
   last complete checkpoint's, else the estimate from the model states) and the ranks agree: one short rank
   stops them all before anything is written.
2. begin(): rank 0 creates the staging folder (and removes stale ones).
3. The engine hands its files to a StagedWrites: written at once, or (background=True) captured in host
   memory and written by a thread while training goes on.
4. The ranks exchange what happened (all_gather): if any write failed, rank 0 removes the staging folder and
   every rank raises SaveFailed, one line naming the step, the cause and the last complete checkpoint;
   otherwise commit(): manifest, rename, `latest`, rotation (--save-total-limit).

In the background, steps 3-4 run on a separate gloo group (collectives of two threads must not share one), as
torch.distributed.checkpoint.async_save does; `latest` moves only when the write is complete. A crash (even
SIGKILL) at any moment leaves `latest` and every complete checkpoint as they were.
"""

from __future__ import annotations

import datetime
import pathlib
import shutil
import threading
from dataclasses import dataclass

import torch.distributed as dist

from zero_train.checkpoint import atomic
from zero_train.checkpoint.resume import RUN_FILE
from zero_train.checkpoint.rotation import complete_checkpoints
from zero_train.checkpoint.storage import (
    SaveFailed,
    StorageError,
    check_free_space,
    checkpoint_bytes,
    failure_line,
    latest_name,
)
from zero_train.checkpoint.writes import StagedWrites
from zero_train.registry import find_engine
from zero_train.runtime.dist import rank0_work_timeout_s


@dataclass(kw_only=True, slots=True)
class SaveOptions:
    """Where and how the loop saves checkpoints."""

    save_dir: str
    """The --save-dir."""
    keep_last: int | None = None
    """--save-total-limit: keep only this many complete checkpoints (None: all)."""
    background: bool = False
    """--async-save: write in a background thread (the next save and the end of training wait for it)."""

    def __post_init__(self) -> None:
        if self.keep_last is not None and self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {self.keep_last}")


class CheckpointSaver:
    """Saves checkpoints for one run (collective: every rank makes the same calls in the same order).

    Args:
        options: SaveOptions.
        dist_info: this process's DistInfo.
    """

    def __init__(self, options: SaveOptions, *, dist_info) -> None:
        self.options = options
        self.dist_info = dist_info
        self.last_bytes: int | None = None  # size of the newest complete checkpoint, once known
        self._group = None
        if options.background and dist_info.world_size > 1:
            # the background thread's own collectives, with the long timeout of rank 0's solo work
            timeout = datetime.timedelta(seconds=rank0_work_timeout_s())
            self._group = dist.new_group(backend="gloo", timeout=timeout)
        self._thread: threading.Thread | None = None
        self._outcome: pathlib.Path | BaseException | None = None

    def save(
        self,
        engine,
        *,
        step: int,
        client_state: dict,
        run_info: dict,
        estimated_bytes: int | None,
        process_group=None,
        extra_files: dict[str, pathlib.Path] | None = None,
    ):
        """Save `engine` at `step`; returns the checkpoint folder, or None while it is written in the background.

        Args:
            engine: the training engine (hands its files to a StagedWrites).
            step: optimizer steps done.
            client_state: this rank's loop state (step, data position, rng).
            run_info: what rank 0 records in run.json.
            estimated_bytes: the checkpoint's size from the model states (used before any save is known).
            extra_files: relpath -> a file rank 0 copies into the checkpoint (the tokenizer's files and the
                generation config, so that the checkpoint exports on its own: zero_train.train.checkpoints).
            process_group: where the ranks wait while rank 0 works alone (creating the staging folder,
                hashing and publishing; zero_train.runtime.dist.rank0_work_group's long timeout); a
                background save uses a long-timeout group of its own.

        Raises:
            SaveFailed: on every rank, if the disk is too full, or any rank's write failed.
        """
        self.wait()
        save_dir = self.options.save_dir
        needed = self._needed_bytes(estimated_bytes)
        self._agree(step, check_free_space(save_dir, needed), group=None)
        try:
            staging = atomic.begin(save_dir, step, dist_info=self.dist_info, process_group=process_group)
        except StorageError as err:
            raise self._failed(step, err, culprit=0) from None
        writes = StagedWrites(staging, defer=self.options.background, save_dir=save_dir, needed_bytes=needed)
        engine.save_checkpoint(writes, client_state=client_state)
        if self.dist_info.is_main:
            writes.json(RUN_FILE, dict(run_info, step=step))
            for relpath, source in (extra_files or {}).items():
                writes.copy(relpath, source)
        if not self.options.background:
            return self._finish(step, writes, group=process_group)
        self._outcome = None
        self._thread = threading.Thread(
            target=self._finish_in_background, args=(step, writes), name=f"save-step-{step}", daemon=True
        )
        self._thread.start()
        return None

    def failed_in_background(self) -> bool:
        """True once this rank's background save has failed (cheap; for the per-step check)."""
        return isinstance(self._outcome, BaseException)

    def finished_in_background(self) -> pathlib.Path | None:
        """The folder of a background save that has completed since the last call (None: none, or running)."""
        if self._thread is None or self._thread.is_alive() or self.failed_in_background():
            return None
        return self.wait()

    def wait(self) -> pathlib.Path | None:
        """Wait for the background save, if any; returns its checkpoint folder.

        Raises:
            SaveFailed: the background save failed (every rank raises it: they agreed in the thread).
        """
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        outcome, self._outcome = self._outcome, None
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _finish_in_background(self, step: int, writes: StagedWrites) -> None:
        try:
            self._outcome = self._finish(step, writes, group=self._group)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which raises it in wait()
            self._outcome = err

    def _finish(self, step: int, writes: StagedWrites, *, group) -> pathlib.Path:
        """Write what is deferred, agree on the outcome, commit (or remove the staging folder)."""
        writes.write_all()
        written = self._agree(step, writes.error, group=group, staging=writes.staging, written=writes.written)
        try:
            final = atomic.commit(
                self.options.save_dir,
                writes.staging,
                dist_info=self.dist_info,
                process_group=group,
                written=written,
                keep_last=self.options.keep_last,
            )
        except StorageError as err:
            raise self._failed(step, err, culprit=0) from None
        self.last_bytes = checkpoint_bytes(final) or self.last_bytes  # the manifest counts every file
        return final

    def _agree(self, step: int, error: StorageError | None, *, group, staging=None, written=None) -> dict:
        """Exchange every rank's outcome; SaveFailed on every rank if any failed. Returns all files written."""
        mine = (None if error is None else (error.what, error.fix), written or {})
        outcomes = [mine]
        if self.dist_info.world_size > 1:
            outcomes = [None] * self.dist_info.world_size
            dist.all_gather_object(outcomes, mine, group=group)
        culprit = next((rank for rank, (problem, _) in enumerate(outcomes) if problem), None)
        if culprit is None:
            return {path: size for _, files in outcomes for path, size in files.items()}
        if staging is not None and self.dist_info.is_main:
            shutil.rmtree(staging, ignore_errors=True)  # every rank has stopped writing into it
        own = outcomes[self.dist_info.rank][0]
        what, fix = own if own else outcomes[culprit][0]
        raise self._failed(step, StorageError(what, fix), culprit=None if own else culprit)

    def _failed(self, step: int, err: StorageError, *, culprit: int | None) -> SaveFailed:
        return SaveFailed(
            failure_line(
                rank=self.dist_info.rank,
                step=step,
                error=err,
                save_dir=self.options.save_dir,
                culprit=culprit,
            )
        )

    def _needed_bytes(self, estimated_bytes: int | None) -> int | None:
        if self.last_bytes is None:
            self.last_bytes = _newest_checkpoint_bytes(self.options.save_dir)
        return self.last_bytes or estimated_bytes


def _newest_checkpoint_bytes(save_dir) -> int | None:
    """The size of the checkpoint `latest` names (else the newest complete one); None if there is none."""
    folder = pathlib.Path(save_dir)
    name = latest_name(folder)
    if name and (size := checkpoint_bytes(folder / name)):
        return size
    try:
        newest = complete_checkpoints(folder)
    except OSError:
        return None
    return checkpoint_bytes(newest[-1]) if newest else None


def estimate_checkpoint_bytes(engine, *, num_params: int, dist_info) -> int:
    """About how big a checkpoint of `engine` is, before any was written (collective).

    fp32 weights (4 bytes per parameter) plus every rank's optimizer state and fp32 masters (one rank's
    for engines that keep them whole on every rank: ddp and ZeRO stage 0).

    Args:
        engine: the training engine (its memory_categories()).
        num_params: parameters of the full model.
        dist_info: this process's DistInfo.

    Returns:
        Bytes.
    """
    categories = engine.memory_categories()
    local = int(categories.get("optimizer_states", 0)) + int(categories.get("master_params", 0))
    per_rank = [local]
    if dist_info.world_size > 1:
        per_rank = [0] * dist_info.world_size
        dist.all_gather_object(per_rank, local)
    spec = find_engine(engine.name)
    sharded = (spec is None or spec.sharding != "replicated") and engine.settings.zero_stage > 0
    return 4 * num_params + (sum(per_rank) if sharded else max(per_rank))
