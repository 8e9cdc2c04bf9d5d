"""Work rank 0 does alone waits in a long-timeout side group, not under the short collective timeout.

Two gloo ranks run the training loop (zero1, bf16, 2 steps, a save and --export-hf) with the collective
timeout at 3 s, while rank 0 takes 4 s longer in each piece of its lone work: building the dataset,
hashing the checkpoint's files (the manifest) and writing the export. Waiting in the default group, rank
1 would time out in each (gloo raises after 3 s); in zero_train.runtime.dist.rank0_work_group it waits.
"""

from __future__ import annotations

import time

import pytest

from zero_train.testing import run_ranks

pytestmark = pytest.mark.tier("multiproc")

TIMEOUT_S, SLOWER_S = 3, 4


def _slow_on_rank0(module, name: str, rank: int, slowed: list[str]) -> None:
    original = getattr(module, name)

    def slow(*args, **kwargs):
        if rank == 0:
            time.sleep(SLOWER_S)
            slowed.append(name)
        return original(*args, **kwargs)

    setattr(module, name, slow)


def _train(rank: int, world_size: int, workdir: str) -> dict:
    from zero_train.checkpoint import atomic
    from zero_train.hf import data
    from zero_train.runtime.dist import init_distributed
    from zero_train.train import loop
    from zero_train.train.args import parse_args
    from zero_train.train.loop import Trainer
    from zero_train.train.setup import plan_run

    slowed: list[str] = []  # each name where it is called from: the loop imported export_model at its top
    for module, name in ((data, "load_text_dataset"), (atomic, "write_manifest"), (loop, "export_model")):
        _slow_on_rank0(module, name, rank, slowed)
    args = parse_args([
        "--engine", "zero1", "--model", "tiny", "--dataset", f"{workdir}/corpus.txt", "--block-size", "32",
        "--micro-batch-size", "2", "--max-steps", "2", "--precision", "bf16", "--no-progress",
        "--eval-batches", "1", "--save-dir", f"{workdir}/ckpt", "--export-hf", f"{workdir}/hf",
    ])  # fmt: skip
    started = time.perf_counter()
    summary = Trainer(args, plan_run(args, world_size=world_size), init_distributed()).run()
    return dict(summary, wall_s=time.perf_counter() - started, slowed=slowed)


def test_rank0_alone_outlasts_the_collective_timeout(tmp_path, monkeypatch):
    from zero_train.hf.offline import stdlib_files

    text = "\n\n".join(path.read_text(errors="replace") for path in stdlib_files(40_000))
    (tmp_path / "corpus.txt").write_text(text)
    monkeypatch.setenv("ZT_COLLECTIVE_TIMEOUT_S", str(TIMEOUT_S))  # the spawned ranks' default group
    ranks = run_ranks(_train, 2, args=(str(tmp_path),))
    assert all(r["steps"] == 2 and r["export"] == str(tmp_path / "hf") for r in ranks)
    assert sorted(ranks[0]["slowed"]) == ["export_model", "load_text_dataset", "write_manifest"]
    assert ranks[1]["wall_s"] > 3 * SLOWER_S  # rank 1 did wait for all three (longer than the timeout each)
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert (tmp_path / "ckpt" / "step-00000002" / "manifest.json").is_file()
