"""Starting training runs under a launcher (deepspeed, torchrun, accelerate) for ``profile``, ``bench`` and ``plan``.

- ``command``: the one builder of launch command lines (launcher, ranks, machines -> argv; shell-quoted text).
- ``cells``: one cell of a comparison matrix (an engine at a world size): its name and generated DeepSpeed config.
- ``launcher``: checking the launcher, the model facts every cell shares, running one command into a log.
"""
