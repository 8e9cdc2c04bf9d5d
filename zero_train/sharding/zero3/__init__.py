"""Our ZeRO-3: parameters, gradients and optimizer state all sharded; each unit gathered around its use.

model.py        Zero3Model: each unit gathered around the forward and backward that use it, then freed
units.py        which parameters form a unit; a unit's slice, gathered buffer and gradient slice
hooks.py        how a module's backward is seen to begin (output hooks) and end (an identity function)
grads.py        each unit's gradients reduce-scattered as soon as backward completes them, in one order
optim.py        Zero3Optimizer: the shared step (../step.py) over this rank's slices; masters rounded into them
state.py        functions of the optimizer: its shards, re-cut at any world size; weights one tensor at a time
report.py       a function of the optimizer: the bytes it holds by category
meta_build.py   MetaBuild: a model built on the meta device, each parameter replayed with the same values
"""
