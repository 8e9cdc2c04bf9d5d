"""Hugging Face models, tokenizers and data, online or from the offline default.

- ``models``: presets, ``model_config`` / ``build_model`` / ``load_model``, tokenizers, context checks.
- ``shapes``: real model sizes without a download: published architecture configs as presets, config.json files.
- ``data``: datasets loaded, tokenized, packed into blocks and sharded per rank.
- ``offline``: the offline default: the Python standard library's sources as a corpus and the BPE
  tokenizer trained on them (shipped in ``zero_train/assets``).
"""
