"""`zero-train bench`: every engine on the same model, data, batch and world size, interleaved (cli/bench.py)."""
