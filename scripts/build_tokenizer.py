"""Build the shipped offline tokenizer (run once; the output is committed, runs never train).

    .venv/bin/python scripts/build_tokenizer.py                 # -> zero_train/assets/stdlib-bpe/
    .venv/bin/python scripts/build_tokenizer.py --out /tmp/bpe  # somewhere else

A byte-level BPE with 8192 tokens trained with `tokenizers` on the Python standard library's .py
sources (see zero_train/hf/offline.py). Takes seconds (docs/startup.md#the-offline-tokenizer).
"""

from __future__ import annotations

import argparse
import json
import pathlib

from zero_train.hf.offline import DEFAULT_TOKENIZER_NAME, OFFLINE_VOCAB_SIZE, train_stdlib_tokenizer

DEFAULT_OUT = pathlib.Path(__file__).resolve().parents[1] / "zero_train" / "assets" / DEFAULT_TOKENIZER_NAME


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--vocab-size", type=int, default=OFFLINE_VOCAB_SIZE)
    args = parser.parse_args()
    info = train_stdlib_tokenizer(args.out, vocab_size=args.vocab_size)
    print(json.dumps(info, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
