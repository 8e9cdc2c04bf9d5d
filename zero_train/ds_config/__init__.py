"""The one place that knows DeepSpeed's JSON keys: reading, generating and validating configs, and the
engine-neutral TrainSettings every engine trains with.

    cfg = load_config("ds_configs/zero2.json")
    settings = train_settings(cfg, world_size=dist_info.world_size, lr=args.lr)
    ds_config = resolve_auto(cfg, settings)          # what deepspeed.initialize gets
    lr = lr_at(settings, applied_steps)              # DeepSpeed's schedule as a pure function

- ``keys``: THE table: every key zero_train fills or defaults (DeepSpeed's default, ours, the HF Trainer's,
  scripts/train.py's, when "auto" is filled); ``PRECISIONS``.
- ``auto``: the one pass that fills "auto" (and given values) from that table.
- ``settings``: ``TrainSettings``, ``train_settings`` (config + flags) and ``resolve_auto`` (settings -> config).
- ``parse``: single fields of a filled config, with DeepSpeed's defaults and rules.
- ``schedule``: the lr schedule as a pure function, identical to DeepSpeed's schedulers.
- ``generate``: flags -> the minimal honest config (`zero-train config`).
- ``check``: `zero-train config check`, with DeepSpeed's own pydantic classes (the one module here that imports
  DeepSpeed).
- ``accelerate``: Hugging Face accelerate configs beside the DeepSpeed JSON, and the flags both must agree on.
- ``io``: reading and writing config files, one-line errors for every bad file.
"""

import importlib

# name -> the module defining it. Loaded on first use (PEP 562): `zero-train --help` needs only keys.PRECISIONS
# and should not pay for the rest of the package.
_EXPORTS = {
    "TrainSettings": "settings",
    "config_text": "io",
    "load_config": "io",
    "lr_at": "schedule",
    "resolve_auto": "settings",
    "settings_from_config": "settings",
    "train_settings": "settings",
    "write_config": "io",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
