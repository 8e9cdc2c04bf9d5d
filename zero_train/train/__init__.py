"""One training run (``python -m zero_train.train``): one path for real training and for profiling.

- ``config``: the typed run config, in parts (model, data, training, optimizer, engine, checkpoint, evaluation,
  output); every field is a flag.
- ``args``: the command line derived from it (and ``--config run.toml``), and ``run_argv``: a config back to flags.
- ``main``: the entry point (``__main__``; scripts/train.py and ``zero-train train`` call it).
- ``setup``: ``plan_run`` (run config -> a checked ``RunPlan``: DeepSpeed config, engine, tokenizer) and the model
  builder.
- ``loop``: ``run_training``: data, engine, steps, evaluation, export, run record.
- ``data``: the run's batches (packed up front, or streamed), the steps of an epoch, a stream's read position.
- ``tracking``: ``--report-to``: the JSONL file, TensorBoard, trackio, W&B, MLflow.
- ``checkpoints``: the run's saves (every --save-every steps, at the end, in the background) and its resume.
- ``eval``: held-out loss and perplexity.
- ``metrics``: the step line, per-rank memory, the progress bar.
- ``numerics``: what a non-finite loss or gradient norm does (stop / skip).
- ``log``: the rank-aware logger (and --output-dir's train.log).
"""
