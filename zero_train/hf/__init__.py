"""Hugging Face models, tokenizers and data, online or from the offline default.

- ``models``: presets, ``model_config`` / ``build_model`` / ``load_model``, ``load_tokenizer``, context checks.
- ``tokenizer``: which tokenizer a run uses (the model's own, or the offline one) and the vocabulary check.
- ``shapes``: real model sizes without a download: published architecture configs as presets, config.json files.
- ``sources``: what a --dataset names (local path, hub id, the default), told without importing datasets.
- ``data``: datasets loaded (a column, a configuration, conversations), a held-out split, rank 0 first.
- ``packing``: tokenized and packed into blocks; each rank's micro-batches of a seeded shuffle.
- ``chat``: conversations rendered (chat template or a simple one) with labels on the assistant turns only.
- ``streaming``: datasets read lazily, each rank its share, with a read position that resumes exactly.
- ``offline``: the offline default: the Python standard library's sources as a corpus and the BPE
  tokenizer trained on them (shipped in ``zero_train/assets``).
"""
