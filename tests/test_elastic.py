"""Elastic resume: our zero1 checkpoint saved by 2 ranks resumes on 1 and on 3 ranks.

After loading at the new world size, the re-sharded optimizer state gathered back to rank 0 must equal the
state the 2 ranks saved (every exp_avg / exp_avg_sq / step, bit for bit) and the weights must equal the
checkpoint's; then `--resume auto` trains on from the saved step.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from zero_train.testing import run_ranks

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 10**9,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 1},
}
SAVED_AT = 3


def _flags(root: pathlib.Path, *extra: str) -> list[str]:
    return [
        "--deepspeed_config", str(root / "zero1.json"), "--engine", "zero1", "--model", "tiny",
        "--dataset", str(root / "corpus.txt"), "--block-size", "32", "--seed", "2", "--no-progress",
        "--eval-every", "0", "--save-dir", str(root / "ckpt"), *extra,
    ]  # fmt: skip


def _trainer(argv: list[str], world_size: int):
    from zero_train.dist import init_distributed
    from zero_train.train_args import parse_args
    from zero_train.train_loop import Trainer
    from zero_train.train_setup import plan_run

    args = parse_args(argv)
    return Trainer(args, plan_run(args, world_size=world_size), init_distributed())


def _train(rank: int, world_size: int, argv: list[str]) -> dict:
    summary = _trainer(argv, world_size).run()
    return {key: summary[key] for key in ("final_loss", "start_step", "steps")}


def _load_and_compare(rank: int, world_size: int, argv: list[str], ckpt: str) -> dict | None:
    """Load the world-2 checkpoint here; on rank 0 compare the gathered state with the saved shards."""
    from safetensors.torch import load_file

    from zero_train.checkpoint import safe_torch_load
    from zero_train.sharding import consolidate_shards

    engine = _trainer(argv, world_size).engine
    engine.load_checkpoint(pathlib.Path(ckpt))
    gathered = engine.optimizer.consolidated_state_dict(to=0)  # collective
    if rank != 0:
        return None
    shards = [
        safe_torch_load(pathlib.Path(ckpt) / "optim" / f"rank-{r:05d}.pt")["optimizer"] for r in range(2)
    ]
    saved = consolidate_shards(shards)["state"]
    compared = 0
    assert sorted(gathered["state"]) == sorted(saved) and len(saved) > 0
    for index, state in saved.items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(gathered["state"][index][key]), torch.as_tensor(value)), (
                index,
                key,
            )
            compared += 1
    weights = load_file(pathlib.Path(ckpt) / "model" / "model.safetensors")
    model_state = engine.model.state_dict()
    assert all(torch.equal(model_state[name], tensor) for name, tensor in weights.items())
    return {
        "tensors_compared": compared,
        "params": len(saved),
        "shard_sizes": [len(s["state"]) for s in shards],
    }


@pytest.mark.multiproc
def test_zero1_checkpoint_of_two_ranks_resumes_on_one_and_three(tmp_path):
    from zero_train.offline import stdlib_files

    (tmp_path / "corpus.txt").write_text(
        "\n\n".join(p.read_text(errors="replace") for p in stdlib_files(60_000))
    )
    (tmp_path / "zero1.json").write_text(json.dumps(CONFIG))
    run_ranks(_train, 2, (_flags(tmp_path, "--max-steps", str(SAVED_AT)),), timeout_s=300)
    ckpt = tmp_path / "ckpt" / f"step-{SAVED_AT:08d}"
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == ckpt.name

    for world_size in (1, 3):
        argv = _flags(tmp_path, "--max-steps", str(SAVED_AT + 2))
        compared = run_ranks(_load_and_compare, world_size, (argv, str(ckpt)), timeout_s=300)[0]
        assert compared["tensors_compared"] == 3 * compared["params"]  # step, exp_avg, exp_avg_sq each
        assert all(size > 0 for size in compared["shard_sizes"])  # really sharded over the 2 saving ranks
    resumed = run_ranks(
        _train, 3, (_flags(tmp_path, "--max-steps", str(SAVED_AT + 2), "--resume", str(ckpt)),)
    )
    assert [r["start_step"] for r in resumed] == [SAVED_AT] * 3
    assert resumed[0]["steps"] == SAVED_AT + 2 and 0 < resumed[0]["final_loss"] < 10
