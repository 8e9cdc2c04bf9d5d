"""The benchmark's targets, from the registry's bench_targets: which engines it compares, and how (pure data:
the CLI's defaults read it)."""

from zero_train.registry import ENGINES, BenchTarget

PEER_PREFIX = "hf-"
"""The Hugging Face Trainer peer's cell is hf-NAME: the Trainer on engine NAME's config."""
_WHAT = {"step": "step time", "wire": "wire bytes per step", "tokens": "tokens/s"}


def _target(engine: str, target: BenchTarget) -> tuple[str, str, str, str, str]:
    denominator = f"{PEER_PREFIX}{target.than}" if target.peer else target.than
    if target.peer:
        name = f"train.py {engine} / HF Trainer {target.than} {_WHAT[target.what]}"
    else:
        name = f"{engine} / {target.than} {_WHAT[target.what]}"
    return name, engine, denominator, target.what, target.comparison


_ORDERED = sorted(
    ((spec, target) for spec in ENGINES for target in spec.bench_targets),
    key=lambda pair: (pair[1].peer, pair[1].peer and pair[0].ours),
)
TARGETS = tuple(_target(spec.name, target) for spec, target in _ORDERED)
"""(name, numerator cell, denominator cell, what, comparison) of every engine's bench_targets in the
registry's order, those against the Trainer last (a library's before ours): "step" compares median step times, "tokens" tokens/s (the
inverse), "wire" the bytes sent per step; comparison "-": no target, shown."""

TARGET_ENGINES = tuple(dict.fromkeys(e for _, top, bottom, _, _ in TARGETS for e in (top, bottom)))
"""Engines some target compares (they get --repeats runs; the others --other-repeats)."""
