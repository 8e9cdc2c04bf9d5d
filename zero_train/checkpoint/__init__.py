"""Checkpoints that never lie, for every engine.

- ``atomic``: staging folder, manifest (size + sha256 of every file), ``latest`` moved last; verify; safe load.
- ``files``: the per-rank files each engine writes, and the pickle scan that refuses code in a checkpoint.
- ``resume``: RNG and data position saved beside the engine state; ``--resume auto``.
- ``elastic``: our ZeRO-1's shards re-sharded to another world size.
- ``deepspeed_universal``: DeepSpeed checkpoints at another world size through its universal format.
- ``export``: any engine's checkpoint -> a Hugging Face model folder.
"""
