"""Memory: measuring (CPU/CUDA allocator), probing training runs, run records, theory (paper, DeepSpeed) and ours.

from zero_train.memory.measure import allocated_bytes, peak_bytes, reset_peak
from zero_train.memory.probe import MemoryProbe
from zero_train.memory.model.theory import paper_bytes
from zero_train.memory.model.deepspeed_estimate import deepspeed_estimate
from zero_train.memory.model.peak import engine_peak      # our per-phase peak model
"""
