"""Hostile input across every entry point: each bad input exits 2 with one `error:` line and leaves nothing.

One parametrized test drives the cases below through `zero-train config`, `config check`, `estimate`,
`export`, `profile` and scripts/train.py: wrong types, huge numbers, empty files, binary garbage, paths that
do not exist, outputs that cannot be written (below a regular file, or in /proc: both refuse root too), and
damaged checkpoints (truncated file, flipped bit, corrupt manifest, malicious pickles, an unfinished save).
Each case asserts: exit code 2; stderr is exactly one line, `error: ...` with the expected words (so no
traceback); no file or folder appeared, vanished or changed anywhere in the working folder (it holds every
input, the real checkpoint the damaged ones were copied from, and every output path a case names); the
checkpoint or folder a case points at is unchanged byte for byte; a malicious pickle never ran.

Cases run in this process through the same functions the console scripts call (run_cli included), so the
whole sweep takes seconds; two also run as real subprocesses of the scripts. Existing per-command tests
(test_config_bad_input.py, test_train_launch.py, test_checkpoint.py) go deeper into each command.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import torch

pytestmark = pytest.mark.tier("quick")

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
ENV = dict(
    os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1"
)
TRAIN = ["--engine", "ddp", "--model", "tiny", "--block-size", "16", "--max-steps", "2", "--no-progress"]
PLAN = [
    "--model",
    "tiny",
    "--gpus-per-node",
    "2",
    "--host-memory",
    "100",
    "--global-batch-size",
    "4",
    "--block-size",
    "64",
]  # zero-train plan's flags but --gpu-memory
CKPT = "saves/step-00000001"  # the real checkpoint (ddp, tiny, 1 step) every damaged copy starts from


@dataclass
class Case:
    """One bad input: the command, its arguments ({w} is the working folder) and the words of its error."""

    name: str
    command: str  # "zero-train" or "train.py"
    argv: list[str]
    words: str
    preserved: list[str] = field(default_factory=list)  # relative paths whose bytes must not change
    subprocess: bool = False  # also run as a real process of the script


CASES = [
    # zero-train config: wrong type, huge number, outputs that cannot be written
    Case("config-stage-wrong-type", "zero-train", ["config", "--stage", "two", "-o", "{w}/new.json"], "--stage"),
    Case("config-huge-number", "zero-train", ["config", "--micro-batch-size", "1e400", "-o", "{w}/new.json"],
         "--micro-batch-size"),
    Case("config-output-below-a-file", "zero-train", ["config", "-o", "{w}/a_file/ds.json"], "is a file"),
    Case("config-output-in-proc", "zero-train", ["config", "-o", "/proc/zero-train-ds.json"], "cannot write"),
    # zero-train config check: empty, binary, absurdly nested, huge number, wrong type, missing
    Case("check-empty-file", "zero-train", ["config", "check", "{w}/empty.json"], "is not valid JSON"),
    Case("check-binary-garbage", "zero-train", ["config", "check", "{w}/garbage.bin"], "cannot read config file"),
    Case("check-deep-nesting", "zero-train", ["config", "check", "{w}/deep.json"], "nests too deeply",
         subprocess=True),
    Case("check-huge-number", "zero-train", ["config", "check", "{w}/huge.json"],
         "train_micro_batch_size_per_gpu must be a whole number >= 1, got inf"),
    Case("check-wrong-type", "zero-train", ["config", "check", "{w}/wrong-type.json"], "got 'eight'"),
    Case("check-missing-file", "zero-train", ["config", "check", "{w}/missing.json"], "does not exist"),
    # zero-train estimate
    Case("estimate-infinite-params", "zero-train", ["estimate", "--params", "1e400", "--world-size", "2"],
         "--params"),
    Case("estimate-absurd-params", "zero-train", ["estimate", "--params", "1e30", "--world-size", "2"],
         "argument --params: 1e+30 is beyond what is answered (1e+14: 100 trillion parameters"),
    Case("estimate-params-below-one", "zero-train", ["estimate", "--params", "0.5", "--world-size", "2"],
         "a model has at least one parameter"),
    Case("estimate-world-size-beyond-any-cluster", "zero-train", ["estimate", "--params", "7e9", "--world-size",
         "10000000000"], "argument --world-size: 1e+10 is beyond what is answered (1e+07"),
    Case("estimate-margin-leaves-nothing", "zero-train", ["estimate", "--params", "7e9", "--world-size", "2",
         "--gpu-memory", "80", "--gpu-margin", "80"], "a GPU margin of 80 GB leaves nothing of 80 GB"),
    Case("estimate-margin-without-gpu", "zero-train", ["estimate", "--params", "7e9", "--world-size", "2",
         "--gpu-margin", "8"], "give --gpu-memory GB too"),
    Case("estimate-world-size-wrong-type", "zero-train", ["estimate", "--model", "tiny", "--world-size", "two"],
         "--world-size"),
    Case("estimate-missing-model-folder", "zero-train", ["estimate", "--model", "{w}/no-model/", "--world-size",
         "2"], "no such folder"),
    Case("estimate-garbage-config", "zero-train", ["estimate", "--model", "tiny", "--world-size", "2",
         "--config", "{w}/garbage.bin"], "cannot read config file"),
    Case("estimate-huge-block", "zero-train", ["estimate", "--model", "tiny", "--world-size", "2",
         "--block-size", "99999999999"], "argument --block-size: 1e+11 is beyond what is answered"),
    Case("estimate-config-json-not-a-causal-lm", "zero-train", ["estimate", "--model", "{w}/t5-config.json",
         "--world-size", "2"], "'t5' config, not a causal LM"),
    Case("estimate-config-json-garbage", "zero-train", ["estimate", "--model", "{w}/garbage.txt", "--world-size",
         "2"], "as a config.json"),
    Case("estimate-block-beyond-published-context", "zero-train", ["estimate", "--model", "llama-3-8b",
         "--world-size", "8", "--block-size", "8193"], "exceeds llama-3-8b's context (8192)"),
    Case("estimate-offload-without-host-memory", "zero-train", ["estimate", "--model", "tiny", "--world-size", "2",
         "--config", "{w}/offload.json"], "give --host-memory GB"),
    # zero-train export: damaged checkpoints, malicious DeepSpeed pickle, outputs that cannot be written
    Case("export-missing-checkpoint", "zero-train", ["export", "{w}/no-ckpt", "{w}/export-out"], "does not exist"),
    Case("export-truncated-file", "zero-train", ["export", "{w}/ckpt-truncated", "{w}/export-out"],
         "(truncated or overwritten)", preserved=["ckpt-truncated"]),
    Case("export-corrupt-manifest", "zero-train", ["export", "{w}/ckpt-bad-manifest", "{w}/export-out"],
         "manifest.json is corrupt", preserved=["ckpt-bad-manifest"]),
    Case("export-malicious-deepspeed-pickle", "zero-train", ["export", "{w}/ckpt-ds-evil", "{w}/export-out"],
         "refusing to load", preserved=["ckpt-ds-evil"]),
    Case("export-output-below-a-file", "zero-train", ["export", f"{{w}}/{CKPT}", "{w}/a_file/hf"],
         "is a file, not a folder", preserved=["saves"]),
    Case("export-output-in-proc", "zero-train", ["export", f"{{w}}/{CKPT}", "/proc/zero-train-hf"],
         "is not writable", preserved=["saves"]),
    Case("export-output-not-empty", "zero-train", ["export", f"{{w}}/{CKPT}", "{w}/not-empty"], "is not empty",
         preserved=["saves", "not-empty"]),
    # zero-train profile
    Case("profile-output-below-a-file", "zero-train", ["profile", "--model", "tiny", "--engines", "ddp",
         "--world-sizes", "1", "--out", "{w}/a_file/profile"], "is a file, not a folder"),
    Case("profile-world-sizes-wrong-type", "zero-train", ["profile", "--model", "tiny", "--world-sizes", "1,x",
         "--out", "{w}/profile"], "--world-sizes"),
    Case("profile-unknown-engine", "zero-train", ["profile", "--model", "tiny", "--engines", "ddp,ds9",
         "--out", "{w}/profile"], "unknown engine(s) ds9"),
    Case("profile-infinite-timeout", "zero-train", ["profile", "--model", "tiny", "--timeout", "inf",
         "--out", "{w}/profile"], "--timeout"),
    # zero-train bench
    Case("bench-output-below-a-file", "zero-train", ["bench", "--model", "tiny", "--engines", "ddp",
         "--out", "{w}/a_file/bench"], "is a file, not a folder"),
    Case("bench-warmup-not-below-steps", "zero-train", ["bench", "--model", "tiny", "--steps", "3",
         "--warmup", "3", "--out", "{w}/bench"], "--warmup 3 must be at least 0 and below --steps 3"),
    Case("bench-unknown-precision", "zero-train", ["bench", "--model", "tiny", "--precisions", "fp8",
         "--out", "{w}/bench"], "unknown precision(s) fp8"),
    # zero-train plan: nothing fits, inconsistent batch, unknown model, bad numbers and outputs
    Case("plan-nothing-fits", "zero-train", ["plan", *PLAN, "--gpu-memory", "0.000001", "--gpu-margin", "0", "-o",
         "{w}/plan.json"], "no set-up fits"),
    Case("plan-margin-leaves-nothing", "zero-train", ["plan", *PLAN, "--gpu-memory", "1", "-o", "{w}/plan.json"],
         "leave nothing of 1 GB"),
    Case("plan-beyond-the-largest-cluster", "zero-train", ["plan", *PLAN, "--gpu-memory", "80", "--nodes",
         "6000000", "--global-batch-size", "12000000"], "--nodes x --gpus-per-node 1.2e+07 is beyond what the estimate answers"),
    Case("plan-absurd-gpu-memory", "zero-train", ["plan", *PLAN, "--gpu-memory", "1e6"],
         "argument --gpu-memory: 1e+06 is beyond what is answered"),
    Case("plan-inconsistent-batch", "zero-train", ["plan", "--model", "tiny", "--gpus-per-node", "2",
         "--gpu-memory", "80", "--host-memory", "100", "--global-batch-size", "7", "--block-size", "64"],
         "is not a multiple of the 2 ranks"),
    Case("plan-block-beyond-context", "zero-train", ["plan", *PLAN[:-1], "100000", "--gpu-memory", "80"],
         "--block-size 100000 is above the model's context of 256 tokens"),
    Case("plan-unknown-model", "zero-train", ["plan", *PLAN, "--model", "{w}/no-model/", "--gpu-memory", "80"],
         "no such folder"),
    Case("plan-headroom-out-of-range", "zero-train", ["plan", *PLAN, "--gpu-memory", "80", "--headroom", "1.5"],
         "--headroom 1.5"),
    Case("plan-output-in-proc", "zero-train", ["plan", *PLAN, "--gpu-memory", "80", "-o", "/proc/zt-plan.json"],
         "is not writable"),
    Case("plan-accelerate-not-yaml", "zero-train", ["plan", *PLAN, "--gpu-memory", "80", "--format",
         "accelerate", "-o", "{w}/plan.json"], "FILE.yaml"),
    Case("config-accelerate-not-yaml", "zero-train", ["config", "--format", "accelerate", "-o", "{w}/a.json"],
         "FILE.yaml"),
    Case("check-accelerate-garbage", "zero-train", ["config", "check", "{w}/wrong-type.json", "--accelerate",
         "{w}/garbage.bin"], "accelerate config"),
    # scripts/train.py flags
    Case("train-huge-max-steps", "train.py", ["--max-steps", "1e400"], "--max-steps"),
    Case("train-lr-wrong-type", "train.py", ["--lr", "fast"], "--lr"),
    Case("train-negative-seed", "train.py", ["--seed", "-1"], "--seed"),
    Case("train-huge-block-size", "train.py", ["--engine", "ddp", "--block-size", "99999999999"],
         "context of 256"),
    # scripts/train.py configs
    Case("train-config-empty", "train.py", [*TRAIN, "--deepspeed_config", "{w}/empty.json"], "not valid JSON"),
    Case("train-config-binary", "train.py", [*TRAIN, "--deepspeed_config", "{w}/garbage.bin"],
         "cannot read config file"),
    Case("train-config-deep-nesting", "train.py", [*TRAIN, "--deepspeed_config", "{w}/deep.json"],
         "nests too deeply"),
    Case("train-config-a-list", "train.py", [*TRAIN, "--deepspeed_config", "{w}/list.json"], "JSON list"),
    Case("train-config-wrong-type", "train.py", [*TRAIN, "--deepspeed_config", "{w}/wrong-type.json"],
         "got 'eight'"),
    # issue 41: a typo'd DeepSpeed key on every engine (ours never import DeepSpeed), model configs transformers
    # refuses or would misread, a broken JSON line, an output dir holding a run, an HF argument we do not have
    *(Case(f"train-config-typo-{engine}", "train.py", [*TRAIN, "--engine", engine, "--deepspeed", "{w}/typo.json"],
           "did you mean 'stage3_prefetch_bucket_size'?") for engine in ("zero3", "ds3", "fsdp2-z3")),
    Case("train-config-typo-top-level", "train.py", [*TRAIN, "--deepspeed", "{w}/typo-top.json"],
         "unknown top-level key 'gradient_clippin' (DeepSpeed silently ignores it); did you mean"),
    Case("train-model-config-typo", "train.py", [*TRAIN, "--model", "{w}/typo-config.json"],
         "unknown gpt2 config key 'num_hiden_layers'; did you mean 'num_hidden_layers'?"),
    Case("train-model-heads-do-not-divide", "train.py", [*TRAIN, "--model", "{w}/gpt2-63.json"],
         "transformers cannot build this gpt2 model: `embed_dim` must be divisible by num_heads"),
    Case("train-model-folder-heads-do-not-divide", "train.py", [*TRAIN, "--model", "{w}/llama-63"],
         "The hidden size (63) is not a multiple of the number of attention heads (4)"),
    Case("dataset-broken-json-line", "train.py", [*TRAIN, "--dataset", "{w}/broken.jsonl"],
         "broken.jsonl' line 2: not JSON (Expecting ',' delimiter, column 16); fix or remove the line"),
    Case("train-output-dir-holds-a-run", "train.py", [*TRAIN, "--output-dir", "{w}/not-empty"],
         "already holds a run (keep.txt); give --resume auto to continue it, --overwrite-output-dir",
         preserved=["not-empty"]),
    Case("train-hf-argument-we-do-not-have", "train.py", [*TRAIN, "--optim", "adamw_torch"],
         "--optim (an HF Trainer argument) is not supported here: set the DeepSpeed config's optimizer.type"),
    # scripts/train.py datasets
    Case("dataset-empty-file", "train.py", [*TRAIN, "--dataset", "{w}/empty.txt"], "is empty"),
    Case("dataset-blank-file", "train.py", [*TRAIN, "--dataset", "{w}/blank.txt"], "is empty"),
    Case("dataset-binary-garbage", "train.py", [*TRAIN, "--dataset", "{w}/garbage.txt"],
         "cannot read dataset"),
    Case("dataset-garbage-parquet", "train.py", [*TRAIN, "--dataset", "{w}/garbage.parquet"],
         "cannot read dataset"),
    Case("dataset-missing", "train.py", [*TRAIN, "--dataset", "{w}/no-such.txt"], "does not exist"),
    Case("dataset-wrong-extension", "train.py", [*TRAIN, "--dataset", "{w}/garbage.bin"],
         "unsupported file type .bin"),
    Case("dataset-no-text-column", "train.py", [*TRAIN, "--dataset", "{w}/no-text.csv"], "no 'text' column"),
    Case("dataset-single-document", "train.py", [*TRAIN, "--dataset", "{w}/one-word.txt"],
         "has 1 document"),
    # scripts/train.py outputs that cannot be written: refused before any training
    Case("train-save-dir-below-a-file", "train.py", [*TRAIN, "--save-dir", "{w}/a_file/ckpt"],
         "is a file, not a folder"),
    Case("train-metrics-file-in-proc", "train.py", [*TRAIN, "--metrics-file", "/proc/zero-train/m.jsonl"],
         "is not writable"),
    Case("train-memory-report-is-a-folder", "train.py", [*TRAIN, "--memory-report", "{w}/not-empty"],
         "is a folder", preserved=["not-empty"]),
    Case("train-export-below-a-file", "train.py", [*TRAIN, "--export-hf", "{w}/a_file/hf"],
         "is a file, not a folder"),
    # scripts/train.py checkpoint options (full disks and read-only save dirs mid-run: tests/train/test_faults.py)
    Case("train-save-total-limit-zero", "train.py", [*TRAIN, "--save-dir", "{w}/new-saves", "--save-total-limit",
         "0"], "--save-total-limit"),
    Case("train-save-total-limit-without-save-dir", "train.py", [*TRAIN, "--save-total-limit", "2"],
         "--save-total-limit needs --save-dir"),
    Case("train-async-save-without-save-dir", "train.py", [*TRAIN, "--async-save"], "--async-save needs --save-dir"),
    # scripts/train.py --resume: damaged checkpoints are refused naming the file, nothing is written
    Case("resume-missing-folder", "train.py", [*TRAIN, "--resume", "{w}/no-ckpt"], "does not exist"),
    Case("resume-truncated-file", "train.py", [*TRAIN, "--resume", "{w}/ckpt-truncated", "--save-dir",
         "{w}/new-saves"], "model.safetensors has", preserved=["ckpt-truncated"], subprocess=True),
    Case("resume-flipped-bit", "train.py", [*TRAIN, "--resume", "{w}/ckpt-flipped"], "is corrupt (sha256",
         preserved=["ckpt-flipped"]),
    Case("resume-corrupt-manifest", "train.py", [*TRAIN, "--resume", "{w}/ckpt-bad-manifest"],
         "manifest.json is corrupt", preserved=["ckpt-bad-manifest"]),
    Case("resume-unfinished-save", "train.py", [*TRAIN, "--resume", "{w}/saves/step-00000002.tmp-0123abcd"],
         "unfinished save", preserved=["saves"]),
    Case("resume-malicious-pickle", "train.py", [*TRAIN, "--dataset", "{w}/corpus.txt", "--resume",
         "{w}/ckpt-evil", "--save-dir", "{w}/new-saves", "--metrics-file", "{w}/metrics.jsonl",
         "--max-steps", "1"],  # its schedule's horizon: another would be refused before the load
         "refusing to load", preserved=["ckpt-evil"]),
]  # fmt: skip


class _TouchesMarker:
    """Unpickling this creates `marker`: what a malicious checkpoint would do (but harmless)."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> pathlib.Path:
    """The working folder: bad inputs, a real checkpoint and damaged copies of it."""
    root = tmp_path_factory.mktemp("hostile")
    _write_inputs(root)
    with pytest.MonkeyPatch.context() as patch:
        _isolate_world_of_one(patch)
        _train_checkpoint(root)
    _damage_checkpoints(root)
    return root


def _write_inputs(root: pathlib.Path) -> None:
    from zero_train.hf.offline import stdlib_files

    garbage = random.Random(7).randbytes(4096)
    for name in ("garbage.bin", "garbage.txt", "garbage.parquet"):
        (root / name).write_bytes(garbage)
    (root / "corpus.txt").write_text("\n\n".join(p.read_text(errors="replace") for p in stdlib_files(20_000)))
    (root / "empty.json").write_bytes(b"")
    (root / "empty.txt").write_bytes(b"")
    (root / "blank.txt").write_text("\n\n   \n\t\n")
    (root / "one-word.txt").write_text("hello")
    (root / "no-text.csv").write_text("a,b\n1,2\n")
    (root / "a_file").write_text("a regular file where a folder is expected")
    (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (root / "list.json").write_text("[1, 2]")
    (root / "huge.json").write_text('{"train_micro_batch_size_per_gpu": 1e400}')
    (root / "wrong-type.json").write_text('{"train_batch_size": "eight"}')
    (root / "t5-config.json").write_text('{"model_type": "t5", "d_model": 64}')
    offload = {"device": "cpu"}
    (root / "offload.json").write_text(
        json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": offload}})
    )
    zero3 = {"stage": 3, "stage3_prefetch_bucket_sise": 100}
    (root / "typo.json").write_text(
        json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": zero3})
    )
    (root / "typo-top.json").write_text(
        json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_clippin": 1})
    )
    gpt2 = {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_head": 4,
        "n_layer": 2,
        "n_positions": 64,
        "vocab_size": 8192,
    }
    (root / "typo-config.json").write_text(json.dumps({**gpt2, "num_hiden_layers": 2}))
    (root / "gpt2-63.json").write_text(json.dumps({**gpt2, "n_embd": 63}))
    (root / "llama-63").mkdir()
    (root / "llama-63" / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 63,
        "num_attention_heads": 4, "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 8192}))  # fmt: skip
    (root / "broken.jsonl").write_text('{"text": "fine"}\n{"text": "cut" "off"}\n')
    (root / "not-empty").mkdir()
    (root / "not-empty" / "keep.txt").write_text("an earlier export: must survive")


def _isolate_world_of_one(patch: pytest.MonkeyPatch) -> None:
    """In-process runs init a gloo world of one: restore its environment and logger afterwards."""
    import logging

    from zero_train.testing import free_port

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        patch.delenv(name, raising=False)
    patch.setenv("MASTER_PORT", str(free_port()))
    logging.getLogger("zero_train.r0").handlers.clear()  # rebind to this capture's stdout


def _end_world_of_one() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        os.environ.pop(name, None)


def _train_checkpoint(root: pathlib.Path) -> None:
    from zero_train.train.args import parse_args
    from zero_train.train.loop import run_training

    argv = [
        *TRAIN,
        "--max-steps",
        "1",
        "--dataset",
        str(root / "corpus.txt"),
        "--save-dir",
        str(root / "saves"),
    ]
    try:
        run_training(parse_args(argv))
    finally:
        _end_world_of_one()
    (root / "saves" / "step-00000002.tmp-0123abcd").mkdir()  # a save that crashed before its commit


def _damaged_copy(root: pathlib.Path, name: str, damage) -> None:
    """A copy of the real checkpoint, damaged by `damage(folder)`."""
    folder = root / name
    shutil.copytree(root / CKPT, folder)
    damage(folder)


def _rewrite_manifest(folder: pathlib.Path) -> None:
    """What an attacker does after planting a file: a manifest that matches it."""
    from zero_train.checkpoint import atomic as checkpoint

    (folder / "manifest.json").unlink()
    checkpoint.write_manifest(folder)


def _damage_checkpoints(root: pathlib.Path) -> None:
    weights = "model/model.safetensors"

    def truncate(folder):
        (folder / weights).write_bytes((folder / weights).read_bytes()[:-100])

    def flip_a_bit(folder):
        data = bytearray((folder / weights).read_bytes())
        data[len(data) // 2] ^= 0x10
        (folder / weights).write_bytes(bytes(data))

    def plant_pickle(folder):
        torch.save({"client_state": _TouchesMarker(root / "pwned")}, folder / "optim" / "rank-00000.pt")
        _rewrite_manifest(folder)

    def plant_deepspeed_pickle(folder):
        (folder / weights).unlink()
        (folder / "deepspeed" / "state").mkdir(parents=True)
        evil = {"module": {}, "ds_version": "0.19.8", "extra": _TouchesMarker(root / "pwned")}
        torch.save(evil, folder / "deepspeed" / "state" / "mp_rank_00_model_states.pt")
        _rewrite_manifest(folder)

    _damaged_copy(root, "ckpt-truncated", truncate)
    _damaged_copy(root, "ckpt-flipped", flip_a_bit)
    _damaged_copy(root, "ckpt-bad-manifest", lambda f: (f / "manifest.json").write_bytes(b"\x00\xff{garbage"))
    _damaged_copy(root, "ckpt-evil", plant_pickle)
    _damaged_copy(root, "ckpt-ds-evil", plant_deepspeed_pickle)


def _tree(root: pathlib.Path) -> dict[str, tuple]:
    """Every path below root; files with size and modification time (a rewrite shows even at equal size)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else "folder"
        for p in root.rglob("*")
    }


def _digest(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path.parent)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def _run_in_process(case: Case, argv: list[str], capsys) -> tuple[int, str]:
    from zero_train.cli.main import main
    from zero_train.runtime.errors import run_cli
    from zero_train.train.args import parse_args
    from zero_train.train.loop import run_training

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        if case.command == "zero-train":
            main(argv)
        else:
            run_cli(lambda: run_training(parse_args(argv)))
    return exit_info.value.code, capsys.readouterr().err


def _run_subprocess(case: Case, argv: list[str]) -> tuple[int, str]:
    command = (
        [str(BIN / "zero-train")] if case.command == "zero-train" else [sys.executable, "scripts/train.py"]
    )
    proc = subprocess.run([*command, *argv], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=180)
    return proc.returncode, proc.stderr


def _assert_one_error_line(code: int, err: str, words: str) -> None:
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert words in lines[0], lines[0]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_exits_2_with_one_line_and_leaves_nothing(world, case, capsys, monkeypatch):
    argv = [arg.replace("{w}", str(world)) for arg in case.argv]
    before, digests = _tree(world), {path: _digest(world / path) for path in case.preserved}
    _isolate_world_of_one(monkeypatch)
    try:
        code, err = _run_in_process(case, argv, capsys)
    finally:
        _end_world_of_one()
    _assert_one_error_line(code, err, case.words)
    if case.subprocess:
        _assert_one_error_line(*_run_subprocess(case, argv), case.words)
    assert _tree(world) == before  # nothing created (not even an empty folder), removed or rewritten
    assert {path: _digest(world / path) for path in case.preserved} == digests
    assert not (world / "pwned").exists()  # the planted pickles never ran


def test_the_sweep_is_wide():
    """The issue asks for at least 30 bad inputs across the CLI, configs, datasets and checkpoints."""
    assert len({case.name for case in CASES}) == len(CASES) >= 30
    assert {case.command for case in CASES} == {"zero-train", "train.py"}
    assert {case.argv[0] for case in CASES if case.command == "zero-train"} >= {
        "config", "estimate", "export", "profile"
    }  # fmt: skip
    assert sum("check" in case.argv[:2] for case in CASES) >= 5


def test_every_error_line_reaches_stderr_in_one_write(monkeypatch):
    """Ranks of one launch share the launcher's pipe unbuffered (`python -u`): a line written in two pieces
    (print's text, then its newline) interleaves with another rank's ("...'stdlib'error: dataset ...")."""
    import io

    from zero_train.runtime.errors import UsageError, run_cli

    class Recorder(io.StringIO):
        writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return super().write(text)

    recorder = Recorder()
    monkeypatch.setattr(sys, "stderr", recorder)

    def entry():
        raise UsageError("the last problem", problems=["a first problem", "a second problem"])

    with pytest.raises(SystemExit) as exit_info:
        run_cli(entry)
    assert exit_info.value.code == 2
    assert recorder.writes == [
        "error: a first problem\n", "error: a second problem\n", "error: the last problem\n"
    ]  # fmt: skip
