"""The one place that knows DeepSpeed's JSON keys: reading, generating and validating configs, and the
engine-neutral TrainSettings every engine trains with.

    cfg = load_config("ds_configs/zero2.json")
    settings = train_settings(cfg, world_size=dist_info.world_size, lr=args.lr)
    ds_config = resolve_auto(cfg, settings)          # what deepspeed.initialize gets
    lr = lr_at(settings, applied_steps)              # DeepSpeed's schedule as a pure function
"""

from zero_train.ds_config.auto import resolve_auto
from zero_train.ds_config.io import config_text, load_config, write_config
from zero_train.ds_config.schedule import lr_at
from zero_train.ds_config.settings import TrainSettings, settings_from_config, train_settings

__all__ = [
    "TrainSettings",
    "config_text",
    "load_config",
    "lr_at",
    "resolve_auto",
    "settings_from_config",
    "train_settings",
    "write_config",
]
