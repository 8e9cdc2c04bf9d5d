"""Draw a step-time design's held-out sets at random instead of choosing them (design v14 on): six sets of four
engines, in (model, ranks, micro-batch x tokens, accumulation, checkpointing) combinations no earlier design
used, under the check's coverage rules, from a seed written into the design before its run.

    .venv/bin/python scripts/steptime_draw.py --seed 14 --before v14      # prints SETS_V14's held-out sets

Rules (issue 39 item 4 and the designs before): 1, 2 and 4 ranks two sets each; at least four model shapes;
checkpointing in two to four sets, accumulation 2 in two to four; every engine in two or three sets (six engines
three times, three twice); the 25M- and 60M-parameter shapes at one or two sequences of at most 64 tokens (their
steps take 0.3-3 s: the run must stay near a quarter of an hour), the 0.6M ones at 1-8 sequences of 32-256 tokens.
"""

from __future__ import annotations

import argparse
import random

from steptime_designs import DESIGNS, ENGINES

SMALL = ("tiny", "llama-tiny", "qwen2-tiny")
LARGE = ("gpt2-25m", "llama-60m")


def _combo(cell_set: dict) -> tuple:
    return (cell_set["model"], cell_set["world_size"], cell_set["micro_batch_size"], cell_set["block_size"],
            cell_set.get("grad_accum", 1), bool(cell_set.get("gradient_checkpointing")))  # fmt: skip


def _candidates(used: set[tuple]) -> list[tuple]:
    combos = []
    for model in SMALL + LARGE:
        batches = [(1, 32), (1, 64), (2, 32)] if model in LARGE else [
            (mb, block) for mb in (1, 2, 4, 8) for block in (32, 64, 128, 256) if mb * block <= 1024]  # fmt: skip
        for ranks in (1, 2, 4):
            for mb, block in batches:
                combos += [
                    (model, ranks, mb, block, accum, ckpt) for accum in (1, 2) for ckpt in (False, True)
                ]
    return [c for c in combos if c not in used]


def _covered(sets: list[tuple]) -> bool:
    ranks = sorted(c[1] for c in sets)
    return (ranks == [1, 1, 2, 2, 4, 4] and len({c[0] for c in sets}) >= 4
            and 2 <= sum(c[5] for c in sets) <= 4 and 2 <= sum(c[4] == 2 for c in sets) <= 4)  # fmt: skip


def draw(seed: int, before: str) -> list[dict]:
    """Six held-out sets no design before `before` used, drawn with random.Random(seed)."""
    names = list(DESIGNS)
    earlier = names[: names.index(before)] if before in names else names
    used = {_combo(s) for name in earlier for s in DESIGNS[name][0]}
    rng = random.Random(seed)
    candidates = _candidates(used)
    while not _covered(sets := rng.sample(candidates, 6)):
        pass
    engines = ENGINES.split(",")
    rng.shuffle(engines)
    slots = engines * 2 + engines[:6]  # six engines three times, three twice: 24 slots
    while True:  # deal the slots to the sets, four distinct engines each
        rng.shuffle(slots)
        dealt = [slots[i * 4 : i * 4 + 4] for i in range(6)]
        if all(len(set(d)) == 4 for d in dealt):
            break
    return [
        _held_out(combo, sorted(d, key=ENGINES.split(",").index))
        for combo, d in zip(sets, dealt, strict=True)
    ]


def _held_out(combo: tuple, engines: list[str]) -> dict:
    model, ranks, mb, block, accum, ckpt = combo
    name = f"{model}-w{ranks}-b{mb}x{block}" + ("-ckpt" if ckpt else "") + ("-accum2" if accum == 2 else "")
    cell_set = dict(name=name, role="held-out", world_size=ranks, model=model, micro_batch_size=mb,
                    block_size=block, grad_accum=accum, gradient_checkpointing=ckpt, engines=",".join(engines))  # fmt: skip
    if accum == 1:
        del cell_set["grad_accum"]
    if not ckpt:
        del cell_set["gradient_checkpointing"]
    return cell_set


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument(
        "--before", required=True, help="the design being drawn: every design before it is used"
    )
    args = parser.parse_args()
    for cell_set in draw(args.seed, args.before):
        print(cell_set)


if __name__ == "__main__":
    main()
