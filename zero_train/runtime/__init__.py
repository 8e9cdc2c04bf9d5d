"""What every part of zero_train stands on: the process and its failures.

- ``defaults``: the defaults of the flags several commands share, one table, with the reason where one differs.
- ``dist``: ``init_distributed()`` -> a frozen ``DistInfo`` (rank, world size, device, backend), read once.
- ``device``: which device this rank computes on (``ZT_DEVICE``), chosen once; the synchronisation a timing needs.
- ``errors``: ``UsageError`` and ``run_cli`` (one ``error:`` line, exit 2 for usage errors, 1 for faults).
- ``faults``: telling a dead or hung peer from a bug, and saying so in one line.
- ``lifeline``: a launched rank stops when the command or launcher that started it is gone.
- ``outputs``: output paths checked before any work starts.
- ``parser``: ``OneLineParser`` (a bad flag is one line, exit 2) and the flag types every entry point shares.
- ``ports``: a free TCP port for a rendezvous, without importing torch.
"""
