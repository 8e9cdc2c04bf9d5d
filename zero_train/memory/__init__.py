"""Memory, measured: the allocator, each rank's categories during a real run, and the run record.

- ``measure``: bytes allocated now and the peak since a reset (glibc mallinfo2 on CPU, CUDA stats on GPU).
- ``probe``: ``MemoryProbe``: where each rank's bytes go, phase by phase, gathered into one run record.
- ``record``: the run record's schema, validation, reading and writing.
- ``model/``: memory predicted before a run (the paper, DeepSpeed's estimators, our per-phase peak model).
"""
