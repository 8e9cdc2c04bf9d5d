"""`zero-train bench`: every engine on the same model, data, batch and world size, interleaved (cli/bench.py).

- ``cells``: the cells (engine x precision), their interleaved order, and one run's command line.
- ``run``: one run: launch a cell, read its outputs into a sample.
- ``hf_peer``: the peer a user would otherwise pick: the Hugging Face Trainer with the same config, model, data.
- ``summary``: from samples to per-cell numbers and the target ratios (pure).
- ``machine``: the machine a benchmark ran on (CPU flags, cores, versions, load).
- ``markdown``: the benchmark's Markdown tables.
"""
