"""The bad inputs tests/package/test_hostile_input.py drives through every entry point: one Case each (the command,
its arguments with {w} for the working folder, the words of its one-line error, what must stay unchanged)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    # zero-train train's launch flags
    Case("train-launcher-without-ranks", "zero-train", ["train", "--launcher", "deepspeed"],
         "--launcher deepspeed starts ranks: give --nproc-per-node N too"),
    Case("train-no-ranks", "zero-train", ["train", "--nproc-per-node", "0"], "--nproc-per-node"),
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
