"""Measure the host bytes train.py's model build takes, by --load-dtype and under zero.Init, against the estimate.

    python scripts/measure_host_build.py                       # 4 torchrun launches, minutes here
    python scripts/measure_host_build.py --cases ddp-bf16-load,ds3-zero-init
    python scripts/measure_host_build.py --json host_build.json

Writes a Llama-shaped config of 0.32B parameters (20 layers x 1024, SwiGLU 2816, vocabulary 32,000, untied) and
trains it for one step through torchrun and scripts/train.py with --memory-report, three ways: DDP on 1 rank with
--load-dtype fp32, the same with --load-dtype bf16 (fp32 training: the engine casts it up), and DeepSpeed ZeRO-3
on 2 and on 3 ranks (train.py builds under zero.Init, fp32). For every rank it reads the probe's "model_built"
phase: the allocator's peak inside the build minus its level before it (glibc mallinfo2 on CPU), beside the estimate's
start-up host term for the same set-up (zero_train.memory.model.host_build.model_build_bytes, device cpu) and the
whole process's allocator peak of the run. Exit 0 when every build is within 10% of the estimate, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

from zero_train.runtime.errors import UsageError, run_cli

MODEL = dict(
    model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=1024, intermediate_size=2816,
    num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=16, vocab_size=32_000,
    max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-5,
)  # fmt: skip
CASES = {  # name -> (train.py --engine, ZeRO stage of the JSON, --load-dtype, ranks, engine of the estimate)
    "ddp-fp32-load": ("ddp", 0, "fp32", 1, "ddp"),
    "ddp-bf16-load": ("ddp", 0, "bf16", 1, "ddp"),
    "ds3-zero-init": ("deepspeed", 3, "fp32", 2, "ds3"),
    "ds3-zero-init-3": ("deepspeed", 3, "fp32", 3, "ds3"),
}
TOLERANCE = 0.10


def _parser():
    from zero_train.runtime.parser import OneLineParser

    parser = OneLineParser(prog="measure_host_build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)} (default all)"
    )
    return parser


def _ds_config(stage: int) -> dict:
    """Plain SGD (no optimizer state: the step after the build needs the least memory on a shared machine) and
    small buckets (the model's bytes, not DeepSpeed's default 2 GB bucket, should dominate)."""
    zero = {"stage": stage, "reduce_bucket_size": 1_000_000}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=1_000_000, stage3_param_persistence_threshold=10_000)
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": zero,
            "optimizer": {"type": "SGD", "params": {"lr": 1e-3}}, "zero_allow_untested_optimizer": True}  # fmt: skip


def _launch(folder: pathlib.Path, name: str) -> dict:
    """One torchrun launch of scripts/train.py; its memory run record."""
    engine, stage, load_dtype, ranks, _ = CASES[name]
    config, report = folder / f"zero{stage}.json", folder / f"{name}.memory.json"
    config.write_text(json.dumps(_ds_config(stage)))
    scripts = pathlib.Path(__file__).resolve().parent
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
               str(29_600 + stage), str(scripts / "train.py"), "--model", str(folder / "config.json"),
               "--engine", engine, "--deepspeed_config", str(config), "--load-dtype", load_dtype,
               "--precision", "fp32", "--max-steps", "1", "--block-size", "32", "--micro-batch-size", "1",
               "--eval-batches", "1", "--no-progress", "--memory-report", str(report)]  # fmt: skip
    environ = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(command, check=True, env=environ, stdout=subprocess.DEVNULL)
    return json.loads(report.read_text())


def _rows(name: str, record: dict, shape) -> list[dict]:
    from zero_train.memory.model.host_build import model_build_bytes
    from zero_train.registry import engine_spec

    _, _, load_dtype, ranks, estimate_engine = CASES[name]
    predicted = model_build_bytes(engine_spec(estimate_engine), shape, world_size=ranks, load_dtype=load_dtype,
                                  precision="fp32", device="cpu")  # fmt: skip
    rows = []
    for rank in record["ranks"]:
        built = next(phase for phase in rank["phases"] if phase["name"] == "model_built")
        measured = built["peak_bytes"] - rank["baseline_bytes"]
        rows.append(dict(case=name, rank=rank["rank"], measured_bytes=measured, estimate_bytes=predicted,
                         ratio=measured / predicted, run_peak_bytes=rank["peak_bytes"]))  # fmt: skip
    return rows


def main(argv: list[str]) -> int:
    from zero_train.hf.models import model_config
    from zero_train.memory.model.theory import model_shape

    args = _parser().parse_args(argv)
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        raise UsageError(f"--cases: unknown {', '.join(sorted(unknown))}; use {', '.join(CASES)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="zt-host-build-") as tmp:
        folder = pathlib.Path(tmp)
        (folder / "config.json").write_text(json.dumps(MODEL))
        shape = model_shape(model_config(str(folder / "config.json")))
        print(f"model: {shape.num_params:,} parameters")
        print(
            f"{'case':<18} {'rank':>4} {'measured GB':>12} {'estimate GB':>12} {'ratio':>6} {'run peak GB':>12}"
        )
        for name in args.cases.split(","):
            for row in _rows(name, _launch(folder, name), shape):
                print(f"{row['case']:<18} {row['rank']:>4} {row['measured_bytes'] / 1e9:>12.3f} "
                      f"{row['estimate_bytes'] / 1e9:>12.3f} {row['ratio']:>6.3f} {row['run_peak_bytes'] / 1e9:>12.3f}",
                      flush=True)  # fmt: skip
                rows.append(row)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(abs(row["ratio"] - 1) <= TOLERANCE for row in rows) else 1


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
