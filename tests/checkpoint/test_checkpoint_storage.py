"""Checkpoints on real storage (zero_train.checkpoint.save/storage/writes/rotation), one process, real file systems.

A full disk is a real tmpfs of a few MB (mounted here: root can; the tests skip, saying why, where mounting is
not permitted), read-only is a real remount, and a crash is a real SIGKILL. The multi-rank cases (zero1 and
DeepSpeed, one rank failing while the other succeeds) are in tests/train/test_faults.py.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import re
import signal
import subprocess

import pytest
import torch

from zero_train.checkpoint import atomic
from zero_train.checkpoint.files import save_rank_file, write_model
from zero_train.checkpoint.resume import resume_path
from zero_train.checkpoint.rotation import complete_checkpoints, reading
from zero_train.checkpoint.save import CheckpointSaver, SaveOptions
from zero_train.checkpoint.storage import SaveFailed, free_bytes
from zero_train.checkpoint.writes import StagedWrites, snapshot
from zero_train.runtime.dist import DistInfo
from zero_train.testing.storage import tmpfs

pytestmark = pytest.mark.tier("quick")

WORLD_OF_ONE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
MB = 1_000_000


class ModelAndShard:
    """What an engine hands to a save: model/ (config + safetensors weights) and a torch.save'd rank file."""

    def __init__(self, weight_mb: float, shard_mb: float) -> None:
        from zero_train.hf.models import build_model, model_config

        self.model = build_model(model_config("tiny", vocab_size=512))
        self.weights = {"w": torch.randn(int(weight_mb * MB / 4))}
        self.shard = {"exp_avg": torch.randn(int(shard_mb * MB / 4)), "step": 3}

    def save_checkpoint(self, writes, *, client_state: dict) -> None:
        write_model(writes, self.model, self.weights)
        save_rank_file(writes, 0, dict(client_state=client_state, optimizer=self.shard))


def _save(saver: CheckpointSaver, engine, step: int):
    saved = saver.save(engine, step=step, client_state={"step": step}, run_info={}, estimated_bytes=None)
    return saved if saved is not None else saver.wait()


def _names(save_dir: pathlib.Path) -> list[str]:
    return sorted(p.name for p in save_dir.iterdir())


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("big", ["weights", "shard"], ids=["safetensors-fills-disk", "torch.save-fills-disk"])
def test_disk_full_mid_write_one_line_staging_removed_latest_intact(tmp_path, background, big):
    with tmpfs(tmp_path / "fs", "4m") as fs:
        save_dir = fs / "ckpt"
        saver = CheckpointSaver(
            SaveOptions(save_dir=str(save_dir), background=background), dist_info=WORLD_OF_ONE
        )
        _save(saver, ModelAndShard(0.5, 0.5), 1)
        assert saver.last_bytes < 1.5 * MB  # so the free-space check lets the next, bigger save start
        bigger = ModelAndShard(6, 0.1) if big == "weights" else ModelAndShard(0.1, 6)
        with pytest.raises(SaveFailed) as failed:
            _save(saver, bigger, 2)  # the disk fills up halfway: safetensors' / torch.save's own errors
        line = str(failed.value)
        assert re.fullmatch(
            rf"rank 0: saving checkpoint step-00000002 failed: no space left on device on {save_dir} "
            r"\(\d+\.\d MB free, this checkpoint needs about 1\.\d MB\); the last complete checkpoint "
            r"step-00000001 is intact; free space and resume with --resume auto",
            line,
        ), line
        assert _names(save_dir) == ["latest", "step-00000001"]  # the staging folder is gone
        assert resume_path("auto", str(save_dir)) == save_dir / "step-00000001"  # verified by its manifest
        assert free_bytes(save_dir) > 2 * MB  # the half-written files were removed


def test_disk_full_before_saving_fails_early_without_writing(tmp_path):
    with tmpfs(tmp_path / "fs", "4m") as fs:
        save_dir = fs / "ckpt"
        saver = CheckpointSaver(SaveOptions(save_dir=str(save_dir)), dist_info=WORLD_OF_ONE)
        _save(saver, ModelAndShard(1.2, 0.6), 1)
        (fs / "filler").write_bytes(b"x" * (free_bytes(save_dir) - MB))  # another program fills the disk
        with pytest.raises(
            SaveFailed,
            match=r"no space left on device .*\(1\.0 MB free, this checkpoint needs "
            r"about 1\.\d MB\)",
        ) as failed:
            _save(saver, ModelAndShard(1.2, 0.6), 2)
        assert "step-00000002" in str(failed.value)
        assert _names(save_dir) == ["latest", "step-00000001"]  # nothing was begun


@pytest.mark.tier("slow")
def test_read_only_and_vanished_save_dirs_are_one_line_each(tmp_path):
    with tmpfs(tmp_path / "fs", "4m") as fs:
        save_dir = fs / "ckpt"
        saver = CheckpointSaver(SaveOptions(save_dir=str(save_dir)), dist_info=WORLD_OF_ONE)
        _save(saver, ModelAndShard(0.2, 0.2), 1)
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        with pytest.raises(SaveFailed) as failed:
            _save(saver, ModelAndShard(0.2, 0.2), 2)
        assert str(failed.value).startswith(
            f"rank 0: saving checkpoint step-00000002 failed: read-only file system on {save_dir} ("
        ) and str(failed.value).endswith(
            "the last complete checkpoint step-00000001 is intact; make it writable (or pick another "
            "--save-dir) and resume with --resume auto"
        )
        subprocess.run(["mount", "-o", "remount,rw", str(fs)], check=True)
        staging = atomic.begin(save_dir, 3, dist_info=WORLD_OF_ONE)
        writes = StagedWrites(staging, defer=False, save_dir=save_dir)
        writes.text("run.json", "{}")
        subprocess.run(["rm", "-rf", str(staging)], check=True)  # someone deletes the folder mid-save
        writes.torch_save("optim/rank-00000.pt", {"x": torch.ones(3)})
        assert writes.error is not None and writes.error.what.startswith(f"the folder vanished on {save_dir}")
        assert not staging.exists()  # not quietly recreated with half a checkpoint in it


def test_rotation_keeps_exactly_k_and_never_one_being_read(tmp_path):
    saver = CheckpointSaver(SaveOptions(save_dir=str(tmp_path), keep_last=2), dist_info=WORLD_OF_ONE)
    engine = ModelAndShard(0.01, 0.01)
    for step in (1, 2, 3):
        _save(saver, engine, step)
    assert _names(tmp_path) == ["latest", "step-00000002", "step-00000003"]
    with reading(tmp_path / "step-00000002"):  # an export or a resume is reading it
        _save(saver, engine, 4)
        assert _names(tmp_path) == ["latest", "step-00000002", "step-00000003", "step-00000004"]
    _save(saver, engine, 5)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000004", "step-00000005"]
    assert atomic.resolve(tmp_path) == tmp_path / "step-00000005"


def test_snapshot_is_a_copy_that_keeps_tied_tensors_tied():
    weight = torch.nn.Parameter(torch.ones(3, 2))
    state = {"wte": weight.detach(), "lm_head": weight.detach(), "opt": [1, {"m": torch.zeros(2)}]}
    copied = snapshot(state)
    with torch.no_grad():
        weight.add_(1)
        state["opt"][1]["m"].add_(5)
    assert copied["wte"] is copied["lm_head"] and torch.equal(copied["wte"], torch.ones(3, 2))
    assert torch.equal(copied["opt"][1]["m"], torch.zeros(2)) and copied["opt"][0] == 1


def _train_while_saving_in_background(save_dir: str, started) -> None:
    saver = CheckpointSaver(SaveOptions(save_dir=save_dir, background=True), dist_info=WORLD_OF_ONE)
    _save(saver, ModelAndShard(0.1, 0.1), 1)
    saver.save(ModelAndShard(0.1, 200), step=2, client_state={}, run_info={}, estimated_bytes=None)
    started.set()  # save() returned: the 200 MB are being written by the background thread
    while True:
        torch.randn(256, 256) @ torch.randn(256, 256)  # training goes on


def test_sigkill_during_background_save_leaves_last_checkpoint_intact_and_resumable(tmp_path):
    ctx = multiprocessing.get_context("fork")
    started = ctx.Event()
    child = ctx.Process(target=_train_while_saving_in_background, args=(str(tmp_path), started))
    child.start()
    assert started.wait(120)
    staging = [p for p in tmp_path.iterdir() if p.name.startswith("step-00000002.tmp-")]
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert staging, "the background save finished before the kill; the test did not test anything"
    assert (tmp_path / "latest").read_text().strip() == "step-00000001"
    assert resume_path("auto", str(tmp_path)) == tmp_path / "step-00000001"  # verified: resumable
    assert atomic.remove_stale_staging(tmp_path) == staging  # the next save clears the half-written one
