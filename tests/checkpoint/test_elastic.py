"""Elastic resume: zero1 and DeepSpeed ZeRO-1 checkpoints saved by 2 ranks resume on 1 and on 3 ranks.

zero1: after loading at the new world size, the re-sharded optimizer state gathered back to rank 0 must
equal the state the 2 ranks saved (every exp_avg / exp_avg_sq / step, bit for bit) and the weights must
equal the checkpoint's; then `--resume` trains on from the saved step, at each world size.

DeepSpeed: the first resume at another world size converts the checkpoint to DeepSpeed's universal format
(once, with its own manifest; later resumes verify and reuse it); after loading, every parameter's fp32
master, exp_avg and exp_avg_sq (gathered with DeepSpeed's safe_get_full_* helpers), the step counter and
the lr equal those of the 2 saving ranks, bit for bit; then training continues from the saved step.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from zero_train.sharding.zero12 import state as zero12_state
from zero_train.testing import run_ranks

pytestmark = pytest.mark.tier("multiproc")

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
    from zero_train.runtime.dist import init_distributed
    from zero_train.train.args import parse_args
    from zero_train.train.loop import Trainer
    from zero_train.train.setup import plan_run

    args = parse_args(argv)
    return Trainer(args, plan_run(args, world_size=world_size), init_distributed())


def _train(rank: int, world_size: int, argv: list[str]) -> dict:
    summary = _trainer(argv, world_size).run()
    return {key: summary[key] for key in ("final_loss", "start_step", "steps")}


def _load_compare_train(rank: int, world_size: int, argv: list[str], ckpt: str) -> dict:
    """Load the world-2 checkpoint here; on rank 0 compare the gathered state with the saved shards; then the
    same trainer trains on with --resume (loading the checkpoint again)."""
    trainer = _trainer(argv, world_size)
    trainer.engine.load_checkpoint(pathlib.Path(ckpt))
    gathered = zero12_state.consolidated_state_dict(trainer.engine.optimizer, to=0)  # collective
    compared = _compare_with_saved(gathered, trainer.engine, pathlib.Path(ckpt)) if rank == 0 else {}
    summary = trainer.run()
    return {**compared, **{key: summary[key] for key in ("final_loss", "start_step", "steps")}}


def _compare_with_saved(gathered: dict, engine, ckpt: pathlib.Path) -> dict:
    """The gathered optimizer state equals the 2 saving ranks' shards, and the weights the checkpoint's."""
    from safetensors.torch import load_file

    from zero_train.checkpoint.atomic import safe_torch_load
    from zero_train.sharding import consolidate_shards

    shards = [safe_torch_load(ckpt / "optim" / f"rank-{r:05d}.pt")["optimizer"] for r in range(2)]
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
    weights = load_file(ckpt / "model" / "model.safetensors")
    model_state = engine.model.state_dict()
    assert all(torch.equal(model_state[name], tensor) for name, tensor in weights.items())
    return {
        "tensors_compared": compared,
        "params": len(saved),
        "shard_sizes": [len(s["state"]) for s in shards],
    }


def test_zero1_checkpoint_of_two_ranks_resumes_on_one_and_three(tmp_path):
    from zero_train.hf.offline import stdlib_files

    (tmp_path / "corpus.txt").write_text(
        "\n\n".join(p.read_text(errors="replace") for p in stdlib_files(60_000))
    )
    (tmp_path / "zero1.json").write_text(json.dumps(CONFIG))
    run_ranks(_train, 2, (_flags(tmp_path, "--max-steps", str(SAVED_AT)),), timeout_s=300)
    ckpt = tmp_path / "ckpt" / f"step-{SAVED_AT:08d}"
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == ckpt.name

    for world_size in (1, 3):  # each world loads and compares, then trains on in the same ranks
        argv = _flags(tmp_path, "--max-steps", str(SAVED_AT + 2), "--resume", str(ckpt))
        resumed = run_ranks(_load_compare_train, world_size, (argv, str(ckpt)), timeout_s=300)
        compared = resumed[0]
        assert compared["tensors_compared"] == 3 * compared["params"]  # step, exp_avg, exp_avg_sq each
        assert all(size > 0 for size in compared["shard_sizes"])  # really sharded over the 2 saving ranks
        assert [r["start_step"] for r in resumed] == [SAVED_AT] * world_size
        assert compared["steps"] == SAVED_AT + 2 and 0 < compared["final_loss"] < 10


DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 10**9,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "torch_adam": True}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_max_lr": 3e-3}},
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 200_000, "allgather_bucket_size": 200_000},
}


def _ds_flags(root: pathlib.Path, *extra: str) -> list[str]:
    return [
        "--deepspeed_config", str(root / "ds1.json"), "--engine", "deepspeed", "--model", "tiny",
        "--dataset", str(root / "corpus.txt"), "--block-size", "32", "--seed", "2", "--no-progress",
        "--eval-every", "0", "--save-dir", str(root / "ds-ckpt"), *extra,
    ]  # fmt: skip


def _ds_full_state(engine) -> dict:
    """Every parameter's whole fp32 master, exp_avg, exp_avg_sq (collective), the step counter and the lr."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    tensors = {}
    for name, param in engine.ds_engine.module.named_parameters():
        tensors[name] = [
            safe_get_full_fp32_param(param).detach().clone(),
            safe_get_full_optimizer_state(param, "exp_avg").detach().clone(),
            safe_get_full_optimizer_state(param, "exp_avg_sq").detach().clone(),
        ]
    return dict(tensors=tensors, global_steps=engine.ds_engine.global_steps, lr=engine.lr())


def _ds_train_and_record(rank: int, world_size: int, argv: list[str], record: str) -> None:
    trainer = _trainer(argv, world_size)
    trainer.run()
    state = _ds_full_state(trainer.engine)
    if rank == 0:
        torch.save(state, record)  # tensors through a file: a queue would share memory with a dead child


def _ds_load_compare_train(
    rank: int, world_size: int, argv: list[str], ckpt: str, record: str
) -> dict | None:
    """Load the world-2 checkpoint here, compare with what the 2 ranks held, then train on (resuming again)."""
    trainer = _trainer(argv, world_size)
    trainer.engine.load_checkpoint(pathlib.Path(ckpt))
    loaded = _ds_full_state(trainer.engine)
    summary = trainer.run()  # --resume: loads the checkpoint again, reusing the universal conversion
    if rank != 0:
        return None
    saved = torch.load(record, weights_only=True)
    assert (loaded["global_steps"], loaded["lr"]) == (saved["global_steps"], saved["lr"])
    assert loaded["tensors"].keys() == saved["tensors"].keys()
    kinds = ("fp32", "exp_avg", "exp_avg_sq")
    mismatched = [
        (name, kind)
        for name, tensors in saved["tensors"].items()
        for kind, tensor, got in zip(kinds, tensors, loaded["tensors"][name], strict=True)
        if not torch.equal(got, tensor)
    ]
    assert not mismatched, mismatched[:5]
    return dict(
        compared=3 * len(saved["tensors"]), **{k: summary[k] for k in ("start_step", "steps", "final_loss")}
    )


def test_deepspeed_checkpoint_of_two_ranks_resumes_on_one_and_three_through_universal(tmp_path):
    from zero_train.hf.offline import stdlib_files

    (tmp_path / "corpus.txt").write_text(
        "\n\n".join(p.read_text(errors="replace") for p in stdlib_files(60_000))
    )
    (tmp_path / "ds1.json").write_text(json.dumps(DS_CONFIG))
    record = str(tmp_path / "saved-state.pt")
    run_ranks(_ds_train_and_record, 2, (_ds_flags(tmp_path, "--max-steps", str(SAVED_AT)), record))
    ckpt = tmp_path / "ds-ckpt" / f"step-{SAVED_AT:08d}"
    universal = ckpt / "deepspeed" / "universal"
    manifest_stat = None
    for world_size in (1, 3):
        argv = _ds_flags(tmp_path, "--max-steps", str(SAVED_AT + 2), "--resume", str(ckpt))
        result = run_ranks(_ds_load_compare_train, world_size, (argv, str(ckpt), record), timeout_s=300)[0]
        assert result["compared"] > 0
        assert (result["start_step"], result["steps"]) == (SAVED_AT, SAVED_AT + 2)
        assert 0 < result["final_loss"] < 10
        stat = (universal / "manifest.json").stat()
        assert manifest_stat in (None, (stat.st_ino, stat.st_mtime_ns))  # converted once, then reused
        manifest_stat = (stat.st_ino, stat.st_mtime_ns)
    leftovers = [p.name for p in (ckpt / "deepspeed").iterdir() if "universal" in p.name]
    assert leftovers == ["universal"]  # no staging folder, no DeepSpeed `latest_universal` pointer

    from safetensors.torch import load_file

    from zero_train.checkpoint import atomic as checkpoint
    from zero_train.checkpoint.deepspeed_universal import ensure_universal
    from zero_train.checkpoint.export import export_checkpoint
    from zero_train.runtime.dist import DistInfo
    from zero_train.runtime.errors import UsageError

    exported = load_file(export_checkpoint(ckpt, tmp_path / "hf") / "model.safetensors")  # ignores universal/
    saved = torch.load(record, weights_only=True)["tensors"]
    assert all(torch.equal(tensor, saved[name][0]) for name, tensor in exported.items())

    damaged = universal / "zero" / "transformer.wte.weight" / "exp_avg.pt"
    damaged.write_bytes(damaged.read_bytes()[:-7])
    one = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    with pytest.raises(UsageError, match=r"transformer\.wte\.weight/exp_avg\.pt has \d+ bytes, manifest"):
        ensure_universal(ckpt / "deepspeed", source_tag="state", dist_info=one)
    checkpoint.verify(ckpt)  # the checkpoint itself is untouched by the conversion
