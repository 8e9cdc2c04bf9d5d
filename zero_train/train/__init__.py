"""The training run behind ``scripts/train.py``: one path for real training and for profiling.

- ``args``: the command line and its defaults.
- ``setup``: ``plan_run`` (config + flags -> a checked ``RunPlan``) and the model builder.
- ``loop``: ``run_training``: data, engine, steps, evaluation, checkpoints, export, run record.
- ``eval``: held-out loss and perplexity.
- ``metrics``: the step line and the metrics JSONL.
- ``numerics``: what a non-finite loss or gradient norm does (stop / skip).
- ``log``: the rank-aware logger.
"""
