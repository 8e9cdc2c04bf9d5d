"""scripts/train.py --gradient-checkpointing on every engine: the same fp32 losses, fewer saved activations.

One spawned 2-rank job runs the training loop for ddp, our zero1, torch-zero and DeepSpeed ZeRO-1/2/3, each
with and without activation checkpointing, fp32, 2 micro-batches per step, 2 steps. Recomputing a block in backward
repeats the forward's exact ops on the same inputs (no dropout in the presets; torch.utils.checkpoint
restores the RNG state anyway), so the loss curves must be bit for bit the same. The run record says
the run checkpointed, and the probe's saved-activation count drops.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from zero_train.testing import run_ranks

pytestmark = pytest.mark.tier("multiproc")

STEPS = 2  # the second step's loss sees the first step's gradients
ENGINES = {"ddp": (0, "ddp"), "zero1": (1, "zero1"), "torch-zero": (1, "torch-zero"),
           "ds1": (1, "deepspeed"), "ds2": (2, "deepspeed"), "ds3": (3, "deepspeed")}  # fmt: skip


def _config(stage: int) -> dict:
    zero: dict = {"stage": stage, "reduce_bucket_size": 200_000}
    if stage in (1, 2):
        zero["allgather_bucket_size"] = 200_000
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=200_000, stage3_param_persistence_threshold=1000)
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "torch_adam": True}},
        "zero_optimization": zero,
    }


def _train(rank: int, world_size: int, runs: list[list[str]]) -> None:
    from zero_train.runtime.dist import init_distributed
    from zero_train.train.args import parse_args
    from zero_train.train.loop import Trainer
    from zero_train.train.setup import plan_run

    for argv in runs:
        args = parse_args(argv)
        Trainer(args, plan_run(args, world_size=world_size), init_distributed()).run()


def _losses(path: pathlib.Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, path.read_text().splitlines()) if "loss" in r]


def test_checkpointing_keeps_fp32_losses_on_every_engine(tmp_path):
    from zero_train.hf.offline import stdlib_files
    from zero_train.memory.record import load_record

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(p.read_text(errors="replace") for p in stdlib_files(30_000)))
    runs = []
    for name, (stage, engine) in ENGINES.items():  # ZeRO-3 last: its HfDeepSpeedConfig stays alive
        (tmp_path / f"{name}.json").write_text(json.dumps(_config(stage)))
        for mode, extra in (("off", []), ("on", ["--gradient-checkpointing"])):
            runs.append([
                "--deepspeed_config", str(tmp_path / f"{name}.json"), "--engine", engine, "--model", "tiny",
                "--dataset", str(corpus), "--block-size", "32", "--max-steps", str(STEPS), "--no-progress",
                "--eval-batches", "1", "--metrics-file", str(tmp_path / f"{name}-{mode}.jsonl"),
                "--memory-report", str(tmp_path / f"{name}-{mode}.memory.json"), *extra,
            ])  # fmt: skip
    run_ranks(_train, 2, args=(runs,), timeout_s=500)
    for name in ENGINES:
        off, on = _losses(tmp_path / f"{name}-off.jsonl"), _losses(tmp_path / f"{name}-on.jsonl")
        assert len(off) == STEPS and on == off, name  # bit for bit
        record_off = load_record(tmp_path / f"{name}-off.memory.json")
        record_on = load_record(tmp_path / f"{name}-on.memory.json")
        assert record_on["gradient_checkpointing"] is True and record_off["gradient_checkpointing"] is False
        saved_off = record_off["ranks"][0]["categories"]["activations"]
        saved_on = record_on["ranks"][0]["categories"]["activations"]
        assert saved_on < 0.8 * saved_off, (name, saved_on, saved_off)
