"""The training run behind ``scripts/train.py``: one path for real training and for profiling.

- ``args``: the command line and its defaults.
- ``setup``: ``plan_run`` (config + flags -> a checked ``RunPlan``) and the model builder.
- ``loop``: ``run_training``: data, engine, steps, evaluation, export, run record.
- ``checkpoints``: the run's saves (every --save-every steps, at the end, in the background) and its resume.
- ``eval``: held-out loss and perplexity.
- ``metrics``: the step line and the metrics JSONL.
- ``numerics``: what a non-finite loss or gradient norm does (stop / skip).
- ``log``: the rank-aware logger.
"""
