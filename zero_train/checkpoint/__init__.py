"""Checkpoints that never lie, for every engine.

- ``atomic``: staging folder, then rename and ``latest`` moved last; resolve what a user passed; safe load.
- ``manifest``: size + sha256 of every file, written last in a save and verified on load; durable writes.
- ``files``: the per-rank files each engine writes, and the pickle scan that refuses code in a checkpoint.
- ``resume``: RNG and data position saved beside the engine state; ``--resume auto``.
- ``elastic``: our ZeRO-1's shards re-sharded to another world size.
- ``deepspeed_universal``: DeepSpeed checkpoints at another world size through its universal format.
- ``deepspeed_weights``: a DeepSpeed checkpoint's full weights, reassembled by DeepSpeed's zero_to_fp32.
- ``export``: any engine's checkpoint -> a Hugging Face model folder.
"""
