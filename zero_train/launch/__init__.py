"""Starting ``scripts/train.py`` under a launcher (deepspeed, torchrun) from ``profile`` and ``bench``."""
