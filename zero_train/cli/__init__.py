"""`zero-train` subcommands: one file each, `main.py` only registers them (accelerate's layout).

- ``main``: the entry point; builds the parser from every ``<name>_command_parser``.
- ``train``: one training run (the run config's flags; ``python -m zero_train.train`` under a launcher).
- ``config``: generate a DeepSpeed config from flags; ``config check FILE`` validates one.
- ``plan``: the cheapest set-up that fits a model, a cluster and a batch, as a DeepSpeed JSON.
- ``estimate``: per-rank memory for ZeRO stages 0-3 before launching, and which stages fit.
- ``profile``: the memory comparison matrix, one real training run per (engine, world size).
- ``report``: a profile directory -> report.md, PNG plots, summary.json and its compact cells.json.
- ``bench``: every engine on the same run, interleaved.
- ``export``: a training checkpoint -> a Hugging Face model folder.

Building the parser imports no torch, DeepSpeed or transformers (tests/package/test_layout.py): the subcommands
import them when they run.
"""
