"""The benchmark's targets: which engines it compares, and how (pure data: the CLI's defaults read it)."""

# (name, numerator cell engine, denominator cell engine, what, comparison): "step" compares median step
# times, "tokens" tokens/s (the inverse), "wire" the bytes sent per step; comparison "-": no target, shown.
TARGETS = (
    ("zero1 / ddp step time", "zero1", "ddp", "step", "<= 1"),
    ("zero1 / ds1 step time", "zero1", "ds1", "step", "<= 1"),
    ("zero1 / torch-zero step time", "zero1", "torch-zero", "step", "<= 1"),
    ("zero1 / ddp wire bytes per step", "zero1", "ddp", "wire", "<= 1"),
    ("zero2 / ds2 step time", "zero2", "ds2", "step", "<= 0.8"),
    ("zero2 / zero1 step time", "zero2", "zero1", "step", "-"),  # measured: the price of sharding gradients
    ("zero2 / ddp wire bytes per step", "zero2", "ddp", "wire", "<= 1"),
    ("zero3 / ds3 step time", "zero3", "ds3", "step", "<= 0.8"),
    ("zero3 / fsdp2-z3 step time", "zero3", "fsdp2-z3", "step", "<= 1"),
    ("train.py ds1 / HF Trainer ds1 tokens/s", "ds1", "hf-ds1", "tokens", ">= 1"),
    ("train.py zero1 / HF Trainer ds1 tokens/s", "zero1", "hf-ds1", "tokens", ">= 1"),
)


TARGET_ENGINES = tuple(dict.fromkeys(e for _, top, bottom, _, _ in TARGETS for e in (top, bottom)))
"""Engines some target compares (they get --repeats runs; the others --other-repeats)."""
