"""The step-time model against published GPU runs: tokens/s per GPU measured by others, our prediction beside it.

    .venv/bin/python scripts/steptime_published.py            # the table (Markdown) with each row's error
    .venv/bin/python scripts/steptime_published.py --fit      # the matmul efficiency that fits the FIT rows

Rows are copied from two independent sources (ROWS: URL, table, row), each mapped to our set-up: FSDP's FULL_SHARD
and FSDP2 to fsdp2-z3, "selective" activation checkpointing to none (it recomputes a fraction: the prediction is
then a lower bound on time), MPT's shapes (llm-foundry's yamls: d_model, n_layers, n_heads, vocab 50368, tied,
4x MLP) built as GPT-2 configs. The GPU preset's matmul efficiency (timing.constants.MATMUL_EFFICIENCY) is fitted
on the rows marked fit=True only (one per GPU); every other row judges the model.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import transformers

MOSAIC = ("https://github.com/mosaicml/llm-foundry/blob/061f2c7/scripts/train/benchmarking/README.md, table "
          "'H100 80GB BF16'")  # fmt: skip
TITAN = ("https://github.com/pytorch/torchtitan/blob/0413364/docs/performance.md (64 A100 80GB, FSDP2), table "
         "'{}'")  # fmt: skip
MPT = {"760m": (1536, 24, 12), "1b": (2048, 24, 16), "3b": (2560, 32, 20), "7b": (4096, 32, 32),
       "13b": (5120, 40, 40), "30b": (7168, 48, 64), "70b": (8192, 80, 64)}  # fmt: skip
"""MPT model -> (d_model, n_layers, n_heads), llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml."""
LLAMA_3_70B = dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                   num_attention_heads=64, num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                   tie_word_embeddings=False)  # fmt: skip
"""meta-llama/Meta-Llama-3-70B's config.json shape."""

ROWS = [
    # MosaicML llm-foundry, MPT on H100 80GB (bf16, FSDP FULL_SHARD), tokens/s/GPU
    dict(model="mpt-7b", seq=2048, gpus=8, micro=6, accum=1, ckpt=False, measured=10643, mfu=46.44, gpu="h100-sxm",
         source=MOSAIC, fit=True),
    dict(model="mpt-1b", seq=2048, gpus=8, micro=14, accum=1, ckpt=False, measured=45455, mfu=41.82, gpu="h100-sxm",
         source=MOSAIC),
    dict(model="mpt-3b", seq=4096, gpus=8, micro=5, accum=6, ckpt=False, measured=20964, mfu=42.31, gpu="h100-sxm",
         source=MOSAIC),
    dict(model="mpt-13b", seq=2048, gpus=8, micro=2, accum=1, ckpt=False, measured=4792, mfu=39.79, gpu="h100-sxm",
         source=MOSAIC),
    dict(model="mpt-13b", seq=2048, gpus=64, micro=2, accum=1, ckpt=False, measured=4800, mfu=39.86, gpu="h100-sxm",
         source=MOSAIC),
    dict(model="mpt-13b", seq=4096, gpus=8, micro=10, accum=3, ckpt=True, measured=4717, mfu=41.6, gpu="h100-sxm",
         source=MOSAIC),
    dict(model="mpt-7b", seq=8192, gpus=8, micro=8, accum=2, ckpt=True, measured=6935, mfu=37.14, gpu="h100-sxm",
         source=MOSAIC),
    dict(model="mpt-30b", seq=2048, gpus=8, micro=3, accum=21, ckpt=True, measured=2002, mfu=38.11, gpu="h100-sxm",
         source=MOSAIC),
    dict(model="mpt-760m", seq=2048, gpus=32, micro=24, accum=1, ckpt=False, measured=67971, mfu=37.57,
         gpu="h100-sxm", source=MOSAIC),
    dict(model="mpt-70b", seq=2048, gpus=64, micro=8, accum=4, ckpt=True, measured=1039, mfu=42.57, gpu="h100-sxm",
         source=MOSAIC),
    # torchtitan, Llama on 64 A100 80GB (bf16, FSDP2), WPS = tokens/s per GPU
    dict(model="llama-2-13b", seq=4096, gpus=64, micro=2, accum=1, ckpt=False, measured=2162, mfu=61.1,
         gpu="a100-80", source=TITAN.format("Llama 2 performance numbers"), fit=True),
    dict(model="llama-2-13b", seq=4096, gpus=64, micro=2, accum=1, ckpt=False, measured=1904, mfu=53.8,
         gpu="a100-80", source=TITAN.format("Llama 2 performance numbers") + ", selective op AC"),
    dict(model="llama-2-70b", seq=4096, gpus=64, micro=2, accum=1, ckpt=True, measured=353, mfu=50.5,
         gpu="a100-80", source=TITAN.format("Llama 2 performance numbers") + ", full AC"),
    dict(model="llama-3-8b", seq=8192, gpus=64, micro=1, accum=1, ckpt=False, measured=2973, mfu=58.2,
         gpu="a100-80", source=TITAN.format("Llama 3 performance numbers") + ", selective op AC"),
    dict(model="llama-3-70b", seq=8192, gpus=64, micro=1, accum=1, ckpt=True, measured=331, mfu=51.7,
         gpu="a100-80", source=TITAN.format("Llama 3 performance numbers") + ", full AC"),
]  # fmt: skip


def config_of(name: str, seq: int):
    """The transformers config of a row's model."""
    from zero_train.hf.models import model_config

    if name.startswith("mpt-"):
        width, layers, heads = MPT[name[4:]]
        return transformers.GPT2Config(n_embd=width, n_layer=layers, n_head=heads, vocab_size=50368,
                                       n_positions=seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    if name == "llama-3-70b":
        return transformers.LlamaConfig(**{k: v for k, v in LLAMA_3_70B.items() if k != "model_type"})
    return model_config(name)


def predict(row: dict, efficiency: float | None = None) -> float:
    """Predicted tokens/s per GPU (with `efficiency`: that matmul efficiency instead of the preset's)."""
    import dataclasses

    from zero_train.memory.model.activations import count_activations
    from zero_train.memory.model.theory import model_shape
    from zero_train.timing.machine import preset_machine
    from zero_train.timing.step import StepSetup, step_time

    config = config_of(row["model"], row["seq"])
    count = count_activations(config, micro_batch_size=row["micro"], block_size=row["seq"], dtype=torch.bfloat16,
                              gradient_checkpointing=row["ckpt"])  # fmt: skip
    machine = preset_machine(row["gpu"])
    if efficiency is not None:
        machine = dataclasses.replace(
            machine, matmul_tflops={p: r * efficiency for p, r in machine.peak_tflops.items()}
        )
    setup = StepSetup(engine="fsdp2-z3", world_size=row["gpus"], gpus_per_node=8, micro_batch_size=row["micro"],
                      block_size=row["seq"], grad_accum=row["accum"], gradient_checkpointing=row["ckpt"])  # fmt: skip
    step = step_time(model_shape(config), count, setup, machine)
    return step.tokens_per_s / row["gpus"], step.mfu


def fit(gpu: str) -> float:
    """The matmul efficiency at which the fit rows of `gpu` are predicted exactly (bisection)."""
    rows = [row for row in ROWS if row.get("fit") and row["gpu"] == gpu]
    low, high = 0.05, 1.0
    for _ in range(40):
        middle = (low + high) / 2
        ratio = statistics.median(predict(row, middle)[0] / row["measured"] for row in rows)
        low, high = (middle, high) if ratio < 1 else (low, middle)
    return (low + high) / 2


def _short(source: str) -> str:
    """The source's name and what the row says beyond the columns (its URL is under the table)."""
    name = "MosaicML llm-foundry [1]" if source.startswith(MOSAIC) else "torchtitan [2]"
    extra = source.split("numbers'", 1)[1].lstrip(", ") if "numbers'" in source else ""
    return f"{name}{', ' + extra if extra else ''}"


def table() -> str:
    lines = ["| # | model | GPUs | seq | micro x accum | checkpointing | measured tokens/s/GPU (MFU) | predicted "
             "(MFU) | error | fit | source |", "|---|---|---:|---:|---|---|---:|---:|---:|---|---|"]  # fmt: skip
    judged = []
    for index, row in enumerate(ROWS, 1):
        tokens, mfu = predict(row)
        error = tokens / row["measured"] - 1
        if not row.get("fit"):
            judged.append(abs(error))
        lines.append(f"| {index} | {row['model']} | {row['gpus']} x {row['gpu']} | {row['seq']} | {row['micro']} x "
                     f"{row['accum']} | {'full' if row['ckpt'] else 'no'} | {row['measured']:,} ({row['mfu']:.1f}%) | "
                     f"{tokens:,.0f} ({mfu:.1%}) | {error:+.0%} | {'FIT' if row.get('fit') else ''} | "
                     f"{_short(row['source'])} |")  # fmt: skip
    lines += ["", f"[1] {MOSAIC}", f"[2] {TITAN.format('Llama 2 / Llama 3 performance numbers')}", ""]
    lines.append(f"judged rows: {len(judged)}, median |error| {statistics.median(judged):.0%}, max {max(judged):.0%}, "
                 f"within 25%: {sum(e <= 0.25 for e in judged)}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="print the fitted matmul efficiency per GPU")
    args = parser.parse_args()
    if args.fit:
        for gpu in sorted({row["gpu"] for row in ROWS if row.get("fit")}):
            print(f"{gpu}: matmul efficiency {fit(gpu):.3f}")
        return
    print(table())


if __name__ == "__main__":
    main()
