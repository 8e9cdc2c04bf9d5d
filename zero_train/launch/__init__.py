"""Starting ``scripts/train.py`` under a launcher (deepspeed, torchrun) from ``profile`` and ``bench``.

- ``cells``: one cell of a matrix (an engine at a world size): its generated config and launcher command.
- ``launcher``: finding the launcher, the model facts every cell shares, running one command into a log.
"""
