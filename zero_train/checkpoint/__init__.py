"""Checkpoints that never lie, for every engine.

- ``atomic``: staging folder, then rename and ``latest`` moved last; resolve what a user passed; safe load.
- ``manifest``: size + sha256 of every file, written last in a save and verified on load; durable writes.
- ``files``: the per-rank files each engine writes, and the pickle scan that refuses code in a checkpoint.
- ``save``: one save as the loop runs it: free space, every rank writes, the ranks agree, commit; --async-save.
- ``writes``: the files of a save, written at once or snapshotted to host memory and written in a thread.
- ``storage``: what a failed write means (disk full, read-only, vanished), free space, the one-line error.
- ``rotation``: --save-total-limit, and the read lock that keeps a checkpoint being read.
- ``resume``: RNG and data position saved beside the engine state; ``--resume auto``.
- ``elastic``: our ZeRO-1's shards re-sharded to another world size.
- ``deepspeed_universal``: DeepSpeed checkpoints at another world size through its universal format.
- ``deepspeed_weights``: a DeepSpeed checkpoint's full weights, reassembled by DeepSpeed's zero_to_fp32.
- ``export``: any engine's checkpoint -> a Hugging Face model folder.
"""
